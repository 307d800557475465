from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from runners.settings import RunnerSettings


def default_store() -> Path:
    from serving.internals import bentoml_home

    return bentoml_home() / "tenants"


class TenantRunnerSettings(RunnerSettings):
    """The multi-tenant runner. Environment overrides: BUNDLE_TENANTS_<FIELD>."""

    model_config = SettingsConfigDict(env_prefix="BUNDLE_TENANTS_")

    intra_op_threads: int | None = Field(
        1,
        ge=1,
        description="Engine threads per model: tenant models are tiny, a second thread only adds overhead.",
    )
    store: Path = Field(
        default_factory=default_store,
        description="Tenant store directory (default: $BENTOML_HOME/tenants).",
    )
    memory_budget_mb: float = Field(
        256,
        gt=0,
        description="Resident memory for loaded models (estimated per format from their files); "
        "the least recently used are evicted beyond it. The worker stays within its ready size "
        "+ 1.25x this (tests/load/test_tenant_memory.py) unless the budget is so small that what "
        "the allocator keeps between loads dominates (docs/decisions/0010-tenant-memory.md). "
        "Head tenants are outside it.",
    )
    formats: list[Literal["onnx", "tf"]] = Field(
        ["onnx", "tf"],
        description="Whole-model formats this runner serves besides heads, as a JSON list; each "
        "one's runtime is loaded at start. [] serves heads only and loads neither runtime "
        "(TensorFlow alone is most of a start); a tenant of another format is refused.",
    )
    max_upload_mb: float = Field(16, gt=0, description="Largest model archive accepted by upload.")
    load_threads: int = Field(
        1, ge=1, le=8, description="Threads loading models (off the engine thread)."
    )
    keep_versions: int = Field(
        3, ge=1, description="Versions kept per tenant (the current one included)."
    )
    train_dim: int = Field(
        256, ge=8, le=1024, description="Embedding size of models trained through /tenants/train."
    )
    train_epochs: int = Field(30, ge=1, le=500, description="Training epochs for /tenants/train.")

    @property
    def budget_bytes(self) -> int:
        return int(self.memory_budget_mb * 1024 * 1024)

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)
