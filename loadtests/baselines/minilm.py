"""What both hand-written baselines load: MiniLM's tokenizer and its fp32 ONNX model from the model
store, on two engine threads (the stack's runner uses the same)."""

from __future__ import annotations

from models import store
from serving import contracts
from serving.engines.onnx import OnnxEngine
from serving.features import load_tokenizer


def load() -> tuple[object, OnnxEngine]:
    tokenizer = load_tokenizer(store.path_of(contracts.TOKENIZER) / "tokenizer.json")
    engine = OnnxEngine(
        store.path_of(contracts.ONNX_FP32) / "model.onnx",
        contracts.SENTENCE_EMBEDDING,
        threads=2,
        providers=["CPUExecutionProvider"],
    )
    return tokenizer, engine
