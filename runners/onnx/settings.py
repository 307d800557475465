from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from runners.settings import ModelRunnerSettings
from serving.batching.grouping import CALL_OVERHEAD_TOKENS


class OnnxRunnerSettings(ModelRunnerSettings):
    """ONNX Runtime runner. Environment overrides: BUNDLE_ONNX_<FIELD>, e.g. BUNDLE_ONNX_WORKERS=2."""

    model_config = SettingsConfigDict(env_prefix="BUNDLE_ONNX_")

    lanes: int | None = Field(
        None,
        ge=1,
        description="Engine calls run at once per instance, each on one core (one-thread sessions), "
        "shared by every model it serves. Default: the instance's cores (cores // workers). With "
        "more than one lane, a call that is alone runs on a second session per model that uses "
        "every lane's core, so a lone request is not slowed: that costs the memory of a second "
        "session of each model (its weights and its arena again). 1: one session per model on "
        "intra_op_threads threads.",
    )
    call_overhead_tokens: int = Field(
        CALL_OVERHEAD_TOKENS,
        ge=1,
        description="The weight of one engine call in padded tokens, against the padding it saves: "
        "higher values give fewer, larger calls. One for every model; the default is tuned on "
        "throughput with the default lanes (docs/decisions/0001-call-weight.md).",
    )
    providers: list[str] = Field(
        ["CPUExecutionProvider"],
        description="ONNX Runtime execution providers, in order. CUDAExecutionProvider needs onnxruntime-gpu "
        "and a GPU in the image; it is wired through but untested on CPU-only hosts.",
    )

    @model_validator(mode="after")
    def _check_lanes(self) -> OnnxRunnerSettings:
        self.check_cores("lanes", self.lanes)
        if self.lanes not in (None, 1) and self.intra_op_threads is not None:
            raise ValueError(
                "intra_op_threads applies to a single lane; with several lanes each has one thread"
            )
        return self

    @property
    def lane_count(self) -> int:
        if self.lanes is not None:
            return self.lanes
        return 1 if self.intra_op_threads is not None else self.threads
