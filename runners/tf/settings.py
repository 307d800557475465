from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from runners.settings import RunnerSettings
from serving import contracts


class TFRunnerSettings(RunnerSettings):
    """TensorFlow SavedModel runner. Environment overrides: BUNDLE_TF_<FIELD>, e.g. BUNDLE_TF_WORKERS=2."""

    model_config = SettingsConfigDict(env_prefix="BUNDLE_TF_")

    model: str = Field(
        f"{contracts.TF_SAVEDMODEL}:latest", description="Model store tag served as backend 'tf'."
    )
