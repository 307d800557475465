"""What the tokenizer service and the runners exchange: token ids in; embeddings, intents,
tenant versions and timings out. Both sides of every hop import these types from here."""

from __future__ import annotations

from typing import Annotated, Literal

import bentoml
import numpy as np
from bentoml.validators import DType
from pydantic import BaseModel, Field

from serving.catalogue import ModelSpec
from serving.contracts import SPM_VOCAB
from serving.errors import ApiError

MAX_SEQUENCES = 4096  # per runner call
MAX_EXAMPLES = (
    10_000  # texts per tenant-runner call: a training set at most (a classify: far fewer)
)
# Tokens a sequence may have on the wire, whatever the model: the catalogue's bound on max_length.
# Each model's own limits (its vocabulary, its max_length) are checked where the model is known
# (``check_ids``).
MAX_TOKENS = 8192
# A sentence vector's width, at most (a head tenant's vectors come from its encoder).
MAX_WIDTH = 8192

# Strict ints: pydantic's lax int takes true as 1 (and 5.0, "5"); an id is an integer, a JSON one
# over HTTP, a Python int over the tokenizer's pickled hop (tokenizers' and SentencePiece's ids are
# Python ints; a NumPy integer would be refused). The check is pydantic-core's, in Rust, as the
# lax one was.
Sequence_ = Annotated[
    list[Annotated[int, Field(strict=True, ge=0)]],
    Field(min_length=1, max_length=MAX_TOKENS),
]
TokenIds = Annotated[list[Sequence_], Field(min_length=1, max_length=MAX_SEQUENCES)]
# Text pairs (a reranker's, a pair classifier's): where each sequence's second text starts, one
# entry per sequence of ``ids``; absent for single texts.
Segments = Annotated[
    list[Annotated[int, Field(strict=True, ge=0, le=MAX_TOKENS)]],
    Field(min_length=1, max_length=MAX_SEQUENCES),
]
ModelName = Annotated[str, Field(min_length=1, max_length=63)]
# SentencePiece ids, as tenant models take them.
SpmIds = Annotated[
    list[
        Annotated[
            list[Annotated[int, Field(strict=True, ge=0, lt=SPM_VOCAB)]],
            Field(min_length=1, max_length=512),
        ]
    ],
    Field(min_length=1, max_length=MAX_EXAMPLES),
]
Variant = Literal["fp32", "int8"]
# head: a softmax layer over a served encoder's sentence vectors; onnx, tf: a whole model per tenant.
TenantFormat = Literal["head", "onnx", "tf"]
# Sentence vectors, as head tenants take them (one row per text, from the head's encoder).
Vectors = Annotated[
    list[Annotated[list[float], Field(min_length=1, max_length=MAX_WIDTH)]],
    Field(min_length=1, max_length=MAX_EXAMPLES),
]
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
    cache: Literal["hit", "miss"] = Field(
        description="hit: the model was in memory; miss: this request waited for it to load."
    )
    format: TenantFormat = Field(
        "onnx", description="head: a layer over a served sentence encoder; onnx, tf: own model."
    )


class Registered(BaseModel):
    """A new tenant model version (train, upload)."""

    tenant: str
    version: str
    labels: list[str]
    bytes: int
    metrics: dict[str, float]


class TenantInfo(BaseModel):
    """A tenant's current version as the registry describes it."""

    tenant: str
    version: str
    format: TenantFormat
    labels: list[str]
    source: str = Field(description="How the version arrived: train, upload or demo.")
    created: str
    metrics: dict[str, float]
    encoder: str | None = Field(
        None, description="head: the catalogue model whose sentence vectors it reads."
    )
    bytes: int = Field(description="Size of the version's files.")
    versions: list[str] = Field(description="Versions kept on disk, the current one included.")


class Deleted(BaseModel):
    tenant: str
    deleted: bool


def check_segments(ids: list[list[int]], segments: list[int]) -> None:
    """One start within each sequence, or a 400 naming the first that is not."""
    if len(segments) != len(ids):
        raise ApiError(f"segments: {len(segments)} starts for {len(ids)} sequences", 400)
    for row, (start, seq) in enumerate(zip(segments, ids, strict=True)):
        if start > len(seq):
            raise ApiError(
                f"segments[{row}]: {start} is past the sequence's {len(seq)} tokens", 400
            )


def check_ids(ids: list[list[int]], spec: ModelSpec, field: str = "ids") -> None:
    """Token ids that ``spec``'s model can read (its vocabulary, its length), or a 400 naming the
    model and the first id or row that it cannot."""
    longest = max(map(len, ids))
    if longest > spec.max_length:
        row = next(i for i, seq in enumerate(ids) if len(seq) == longest)
        raise ApiError(
            f"{field}[{row}]: {longest} tokens; {spec.name} reads at most {spec.max_length}", 400
        )
    top = max(map(max, ids))
    if top >= spec.vocab_size:
        row = next(i for i, seq in enumerate(ids) if max(seq) == top)
        raise ApiError(
            f"{field}[{row}]: id {top} is not in {spec.name}'s vocabulary of {spec.vocab_size}",
            400,
        )


def timing_headers(queue_ms: float, inference_ms: float) -> dict[str, str]:
    """Per-response timing headers (the names text-embeddings-inference uses)."""
    return {"X-Queue-Time": f"{queue_ms:.2f}", "X-Inference-Time": f"{inference_ms:.2f}"}
