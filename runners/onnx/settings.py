from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from runners.settings import RunnerSettings
from serving import contracts


class OnnxRunnerSettings(RunnerSettings):
    """ONNX Runtime runner. Environment overrides: BUNDLE_ONNX_<FIELD>, e.g. BUNDLE_ONNX_WORKERS=2."""

    model_config = SettingsConfigDict(env_prefix="BUNDLE_ONNX_")

    fp32_model: str = Field(
        f"{contracts.ONNX_FP32}:latest",
        description="Model store tag served as backend 'onnx'. The plain export: ORT's transformer "
        "optimiser (minilm-onnx-opt) measured 0.88-0.92x its speed on these CPUs.",
    )
    int8_model: str = Field(
        f"{contracts.ONNX_INT8}:latest",
        description="Model store tag served as backend 'onnx-int8'.",
    )
    providers: list[str] = Field(
        ["CPUExecutionProvider"],
        description="ONNX Runtime execution providers, in order. CUDAExecutionProvider needs onnxruntime-gpu "
        "and a GPU in the image; it is wired through but untested on these CPU-only machines.",
    )
