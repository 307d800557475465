from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from serving import contracts
from serving.catalogue import Backend
from serving.settings import ServiceSettings

__all__ = ["SETTINGS", "Backend", "TokenizerSettings"]


class TokenizerSettings(ServiceSettings):
    """The public tokenizer service. Environment overrides: BUNDLE_TOKENIZER_<FIELD>.

    ``max_queue_tokens`` and ``deadline_s`` bound each backend's coalescing queue: time spent here
    counts against the same deadline in the runner."""

    model_config = SettingsConfigDict(env_prefix="BUNDLE_TOKENIZER_")

    workers: int = Field(
        1,
        ge=1,
        description="Worker processes. One is enough while a single event loop keeps up with the "
        "runners' engines; add workers when the tokenizer's CPU saturates first.",
    )
    timeout_s: float = Field(30.0, gt=0, description="BentoML traffic timeout for one request.")
    max_texts: int = Field(256, ge=1, description="Texts per /embed or /tokenize request.")
    max_pairs: int = Field(128, ge=1, description="Pairs per /similarity request.")
    max_documents: int = Field(
        256, ge=1, description="Texts per /rerank request (and documents per Cohere rerank)."
    )
    openai_max_inputs: int = Field(
        2048,
        ge=1,
        description="Texts per /v1/embeddings request: OpenAI's own limit, so clients that batch up "
        "to it (LangChain sends 1,000) work unchanged. A request over max_queue_tokens tokens is "
        "refused whatever its count (400 here, 413 on /embed).",
    )
    max_chars: int = Field(
        10_000,
        ge=1,
        description="Characters per text. Longer inputs get 400; tokens beyond the model's limit are truncated.",
    )
    runner_inflight: int = Field(
        2,
        ge=1,
        description="Calls in flight per backend; requests arriving meanwhile are merged into a later call. "
        "A call beyond the first goes out once the last one out is expected to be nine tenths done.",
    )
    # Why 2, not 1: one call in flight makes calls larger, so the runner and the tokenizer spend
    # less per request, but the runner's lanes then idle while a call's last engine calls run and
    # its answer travels back. A second call that waits until the first is nearly done keeps part
    # of the gain without the loss (docs/decisions/0003-coalescing.md).
    runner_call_tokens: int = Field(
        8192,
        ge=1,
        description="Real tokens merged into one runner call (a larger lone request still goes, alone).",
    )
    replica_wait_s: float = Field(
        15.0,
        ge=0,
        description="How long a request waits for a runner that has no replica up (scaled to zero, "
        "or every replica restarting) before it gets 503 with Retry-After; its deadline_s starts "
        "once it is sent. 0: refused at once. replica_wait_s + deadline_s must stay under "
        "timeout_s. Embedding and classify calls wait; the tenant registry's are refused at once.",
    )
    replica_waiters: int = Field(
        1024,
        ge=1,
        description="Requests that may wait for a replica at once, per model and backend (and for "
        "the tenant runner), in each worker; more get 503 with Retry-After at once.",
    )
    sentencepiece_model: str = Field(
        f"{contracts.SENTENCEPIECE}:latest",
        description="The tenants' SentencePiece model (model store tag): whole-model tenants read "
        "its ids.",
    )
    onnx_url: str | None = Field(
        None,
        description="Reach the ONNX runner at this URL (one container per service). Unset: the runner is a "
        "dependency in the same `bentoml serve` graph.",
    )
    tf_url: str | None = Field(
        None, description="Reach the TF runner at this URL; unset: same graph."
    )
    tenant_url: str | None = Field(
        None, description="Reach the tenant runner at this URL; unset: same graph."
    )
    access_log: bool = Field(
        False,
        description="Log every public request (method, path, status, sizes, latency; never headers): "
        "BentoML's access log, the same line on the lean path. Off by default: a line per request "
        "is a real share of a one-sentence request's CPU; request counts and latency per endpoint "
        "and status are in the Prometheus metrics either way, and errors are logged.",
    )
    tenant_keys_file: Path | None = Field(
        None,
        description="Require per-tenant API keys (Authorization: Bearer) on /classify and the registry: a "
        "JSON file of key hashes, managed with `python -m services.tokenizer.keys`. Unset (development): "
        "no keys. Set it in production.",
    )
    admin_enabled: bool = Field(
        True,
        description="Serve the tenant registry (/tenants/train, upload, list, show, delete) on this public "
        "service. Set false in production to keep them off the public port: the endpoints then do not exist.",
    )

    @model_validator(mode="after")
    def _waits_fit(self) -> TokenizerSettings:
        # BentoML ends a request at timeout_s: one that waited for a replica the whole time must
        # still have its deadline after it, and its tokenizing before.
        if self.replica_wait_s + self.deadline_s >= self.timeout_s:
            raise ValueError(
                f"replica_wait_s ({self.replica_wait_s:g}) + deadline_s ({self.deadline_s:g}) "
                f"must stay under timeout_s ({self.timeout_s:g}): raise timeout_s or lower the "
                "others"
            )
        return self


SETTINGS = TokenizerSettings()
