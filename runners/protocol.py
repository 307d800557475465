"""What the tokenizer service and the runners exchange: token ids in, embeddings and timings out."""

from __future__ import annotations

from typing import Annotated, Literal

import bentoml
import numpy as np
from bentoml.validators import DType
from pydantic import BaseModel, Field

from models.contracts import MAX_SEQ_LEN

MINILM_VOCAB = 30522
MAX_SEQUENCES = 4096  # per runner call

Sequence_ = Annotated[
    list[Annotated[int, Field(ge=0, lt=MINILM_VOCAB)]], Field(min_length=1, max_length=MAX_SEQ_LEN)
]
TokenIds = Annotated[list[Sequence_], Field(min_length=1, max_length=MAX_SEQUENCES)]
Variant = Literal["fp32", "int8"]
# What is left of the caller's own deadline; the runner refuses (503) work it cannot finish in time.
DeadlineSeconds = Annotated[float | None, Field(gt=0, le=300)]


class EmbedResult(bentoml.IODescriptor):
    """Rows in request order; timings as the runner measured them."""

    embeddings: Annotated[np.ndarray, DType("float32")]
    queue_ms: float = Field(description="Waiting for a batch round to start")
    inference_ms: float = Field(description="From the round's start to this request's last row")
    engine_calls: int = Field(description="Engine calls that held rows of this request")


class Classified(BaseModel):
    """A tenant runner's answer, passed on as is by the public /classify."""

    intents: list[str]
    scores: list[float] = Field(description="Probability of each predicted intent.")
    version: str = Field(description="The tenant model version that answered.")


class Registered(BaseModel):
    """A new tenant model version (train, upload)."""

    tenant: str
    version: str
    labels: list[str]
    bytes: int
    metrics: dict[str, float]


def timing_headers(queue_ms: float, inference_ms: float) -> dict[str, str]:
    """Per-response timing headers (the names text-embeddings-inference uses)."""
    return {"X-Queue-Time": f"{queue_ms:.2f}", "X-Inference-Time": f"{inference_ms:.2f}"}
