"""Settings every runner has: instances, engine threads and the batching policy (queue limits
come from ``serving.settings.ServiceSettings``).

Each runner subclasses ``RunnerSettings`` with its own env prefix (``BUNDLE_ONNX_``, ``BUNDLE_TF_``…),
so ``BUNDLE_ONNX_WORKERS=2`` overrides one runner and nothing else.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from serving.batching import Policy
from serving.settings import ServiceSettings, available_cores


class RunnerSettings(ServiceSettings):
    workers: int = Field(
        1, ge=1, description="Concurrent instances (worker processes) of this runner."
    )
    intra_op_threads: int | None = Field(
        None,
        ge=1,
        description="Engine threads per instance. Default: cores // workers, so instances never oversubscribe.",
    )
    max_batch_tokens: int = Field(
        1024,
        ge=1,
        description="Padded tokens (rows x longest row) per engine call: past a size a larger call "
        "gains no throughput, and delays every request behind it (docs/decisions/0014).",
    )
    max_batch_rows: int = Field(64, ge=1, description="Sequences per engine call.")
    round_tokens: int = Field(
        8192,
        ge=1,
        description="Real tokens sorted and planned together: the rows held from earlier rounds and "
        "those taken from the queue, topped up once the rows held fall below half of it (a request "
        "larger than the room left still goes, so at most one request over).",
    )
    call_overhead_tokens: int = Field(
        32,
        ge=1,
        description="The weight of one engine call in padded tokens, against the padding it saves: "
        "higher values give fewer, larger calls. One for every model of the runner. The default "
        "suits an engine on several threads; the ONNX runner's is tuned on its one-thread lanes "
        "(docs/decisions/0001-call-weight.md).",
    )
    timeout_s: float = Field(
        30.0, gt=0, description="BentoML traffic timeout for one request to this runner."
    )

    @model_validator(mode="after")
    def _check_threads(self) -> RunnerSettings:
        self.check_cores("intra_op_threads", self.intra_op_threads)
        return self

    def check_cores(self, name: str, per_worker: int | None) -> None:
        """Refuse ``per_worker`` threads (a setting called ``name``) on every worker when together
        they exceed the cores available: the instances would oversubscribe the CPU."""
        cores = available_cores()
        if per_worker is not None and self.workers * per_worker > cores:
            raise ValueError(
                f"workers ({self.workers}) x {name} ({per_worker}) exceeds the {cores} cores "
                "available: instances would oversubscribe the CPU"
            )

    @property
    def threads(self) -> int:
        return self.intra_op_threads or max(1, available_cores() // self.workers)

    @property
    def policy(self) -> Policy:
        return Policy(
            max_batch_tokens=self.max_batch_tokens,
            max_batch_rows=self.max_batch_rows,
            round_tokens=self.round_tokens,
            max_queue_tokens=self.max_queue_tokens,
            deadline_s=self.deadline_s,
            call_overhead_tokens=self.call_overhead_tokens,
        )

    def service_config(self, hot_routes: list[str]) -> dict:
        """The ``@bentoml.service`` keywords these settings decide; ``hot_routes``: the runner's APIs,
        kept out of tracing unless ``trace_requests`` is on (the APIs among them are then answered
        on the lean path; TF Serving's predict route, which has path parameters, by BentoML)."""
        return {
            "service_class": self.service_class(),
            "workers": self.workers,
            "tracing": self.tracing(hot_routes),
            "traffic": {"timeout": self.timeout_s},
            # BentoML's caller recycles its connection pool to a dependency after 100 requests or
            # 300 s (read from the *callee's* config), killing calls in flight: under sustained
            # load a share of requests failed (docs/decisions/0012-runner-hop.md). Never recycle;
            # dead connections are retried by the caller.
            "runner_connection": {"max_requests": 2**62, "max_age": 1e12},
            # Runners sit behind the tokenizer service, whose access log (off by default, a
            # setting) is where public requests are logged; a line per internal call would cost
            # CPU on every hop for a log nobody reads.
            "logging": {"access": {"enabled": False}},
        }


class ModelRunnerSettings(RunnerSettings):
    """A runner of the catalogue's models (ONNX Runtime, TensorFlow)."""

    models: Annotated[list[str] | None, NoDecode] = Field(
        None,
        description="The catalogue's models this runner serves, comma-separated (one container per "
        "model: the same image, a model each). Default: every model of the catalogue built for "
        "this runner's backends.",
    )

    @field_validator("models", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()] or None
        return value
