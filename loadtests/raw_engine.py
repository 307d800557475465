"""The limit: the engine in this process, no HTTP (tokenize + ONNX session, sorted batches)."""

from __future__ import annotations

import os
import statistics
import time


def raw_engine(model: str, repeats: int) -> dict[str, float]:
    """Sentences/s of the engine alone on the load-test corpus, length-sorted, best batch size."""
    from models import corpus, store
    from serving import contracts
    from serving.engines.onnx import OnnxEngine
    from serving.features import load_tokenizer, pad, tokenize

    engine = OnnxEngine(
        store.path_of(model) / "model.onnx",
        contracts.SENTENCE_EMBEDDING,
        threads=os.cpu_count() or 2,
        providers=["CPUExecutionProvider"],
    )
    tokenizer = load_tokenizer(store.path_of(contracts.TOKENIZER) / "tokenizer.json")
    texts = corpus.load_texts()
    rates: dict[int, float] = {}
    for batch in (8, 16, 32, 64):
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            ids = sorted(tokenize(tokenizer, texts), key=len)
            for i in range(0, len(ids), batch):
                engine(pad(ids[i : i + batch]))
            samples.append(len(texts) / (time.perf_counter() - started))
        rates[batch] = statistics.median(samples)
    best = max(rates, key=rates.__getitem__)
    return {"sentences_per_s": rates[best], "batch_size": best, "by_batch_size": rates}
