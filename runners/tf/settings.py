from __future__ import annotations

from pydantic_settings import SettingsConfigDict

from runners.settings import ModelRunnerSettings


class TFRunnerSettings(ModelRunnerSettings):
    """TensorFlow SavedModel runner. Environment overrides: BUNDLE_TF_<FIELD>, e.g. BUNDLE_TF_WORKERS=2."""

    model_config = SettingsConfigDict(env_prefix="BUNDLE_TF_")
