"""MiniLM's tokenizer and its fp32 ONNX model from the model store, on two engine threads (the
stack's runner uses the same), in-process: what the hand-written baselines serve with, and what
builds the demo head tenants' training vectors."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from models import store
from serving import contracts
from serving.engines.onnx import OnnxEngine
from serving.features import load_tokenizer, pad, tokenize


def load(*, spinning: bool = True) -> tuple[object, OnnxEngine]:
    tokenizer = load_tokenizer(store.path_of(contracts.TOKENIZER) / "tokenizer.json")
    engine = OnnxEngine(
        store.path_of(contracts.ONNX_FP32) / "model.onnx",
        contracts.SENTENCE_EMBEDDING,
        threads=2,
        providers=["CPUExecutionProvider"],
        spinning=spinning,
    )
    return tokenizer, engine


class Embedder:
    """Texts to MiniLM fp32 sentence vectors in-process, each distinct text embedded once (demo
    tenants draw their examples from a few thousand template fills)."""

    def __init__(self, batch: int = 64) -> None:
        self.tokenizer, self.engine = load()
        self.batch = batch
        self.vectors: dict[str, np.ndarray] = {}

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        todo = sorted({t for t in texts if t not in self.vectors}, key=len)  # little padding
        for start in range(0, len(todo), self.batch):
            part = todo[start : start + self.batch]
            for text, row in zip(
                part, self.engine(pad(tokenize(self.tokenizer, part))), strict=True
            ):
                self.vectors[text] = row
        return np.stack([self.vectors[t] for t in texts])
