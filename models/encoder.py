"""A catalogue embedding model in-process, from the model store: its tokenizer and fp32 ONNX model on
two engine threads (the stack's runner uses the same). What the hand-written baselines serve with,
and what builds the demo head tenants' training vectors; the default is the catalogue's first embed
model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from models import store
from serving import catalogue
from serving.catalogue import ModelSpec
from serving.engines.onnx import OnnxEngine
from serving.features import load_tokenizer, pad, tokenize
from serving.served import spec_of


def default_name() -> str:
    entry = catalogue.current().default("embed")
    if entry is None:
        raise ValueError(f"the catalogue ({catalogue.path()}) has no embed model")
    return entry.name


def _entry(name: str | None) -> catalogue.Entry:
    entry = catalogue.current().get(name or default_name())
    if entry is None:
        raise ValueError(f"{name!r} is not in the catalogue ({catalogue.path()})")
    return entry


def tokenizer_of(name: str | None = None) -> tuple[Any, ModelSpec]:
    """A model's served tokenizer, and its spec."""
    ref = store.latest(_entry(name).store_name("tokenizer"))
    spec = spec_of(ref)
    return load_tokenizer(Path(ref.path_of("tokenizer.json")), spec.max_length), spec


def load(name: str | None = None, *, spinning: bool = True) -> tuple[Any, OnnxEngine, ModelSpec]:
    """A model's tokenizer, its fp32 ONNX engine on two threads, and its spec."""
    tokenizer, spec = tokenizer_of(name)
    onnx_ref = store.latest(_entry(name).store_name("onnx"))
    engine = OnnxEngine(
        Path(onnx_ref.path_of("model.onnx")),
        spec.contract(),
        threads=2,
        providers=["CPUExecutionProvider"],
        spinning=spinning,
    )
    return tokenizer, engine, spec


class Embedder:
    """Texts to sentence vectors in-process, each distinct text embedded once (demo tenants draw
    their examples from a few thousand template fills). ``name``: the encoder (its catalogue
    name; default: the first embed model)."""

    def __init__(self, name: str | None = None, batch: int = 64) -> None:
        self.name = name or default_name()
        self.tokenizer, self.engine, self.spec = load(self.name)
        self.batch = batch
        self.vectors: dict[str, np.ndarray] = {}

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        todo = sorted({t for t in texts if t not in self.vectors}, key=len)  # little padding
        for start in range(0, len(todo), self.batch):
            part = todo[start : start + self.batch]
            feeds = pad(tokenize(self.tokenizer, part), self.spec.pad_id, self.spec.token_types)
            for text, row in zip(part, self.engine(feeds), strict=True):
                self.vectors[text] = row
        return np.stack([self.vectors[t] for t in texts])
