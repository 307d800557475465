"""The limit: the engine in this process, no HTTP (tokenize + ONNX session), per backend.

The best of two kinds of plan over the load-test corpus: length-sorted batches of a fixed row
count, and the stack's own planner (``serving.batching.plan``) under a sweep of padded-token
budgets. Whichever the engine prefers as it changes, raw stays the best of both: a served figure
above it means the limit is wrong, and the benchmark fails.
"""

from __future__ import annotations

import os
import statistics
import time

ROW_COUNTS = (8, 16, 32, 64, 128)
TOKEN_BUDGETS = (512, 1024, 2048, 4096)


def raw_engine(model: str, repeats: int) -> dict:
    """Sentences/s of the engine alone on the load-test corpus: the best plan, its median rate."""
    from models import corpus, store
    from serving import contracts
    from serving.batching import plan
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
    engine(pad(tokenize(tokenizer, texts[:32])))  # warm-up: allocations, kernel choice

    def batches_of(ids: list[list[int]], how: tuple[str, int]) -> list[list[list[int]]]:
        kind, size = how
        if kind == "rows":
            ordered = sorted(ids, key=len)
            return [ordered[i : i + size] for i in range(0, len(ordered), size)]
        groups = plan([len(s) for s in ids], max_tokens=size, max_rows=256)
        return [[ids[i] for i in group.indices] for group in groups]

    plans = [("rows", n) for n in ROW_COUNTS] + [("tokens", n) for n in TOKEN_BUDGETS]
    rates: dict[str, list[float]] = {f"{kind} {size}": [] for kind, size in plans}
    for _ in range(repeats):
        for how in plans:  # interleaved: a noisy moment does not favour one plan
            started = time.perf_counter()
            ids = tokenize(tokenizer, texts)
            for batch in batches_of(ids, how):
                engine(pad(batch))
            rates[f"{how[0]} {how[1]}"].append(len(texts) / (time.perf_counter() - started))
    medians = {name: statistics.median(samples) for name, samples in rates.items()}
    best = max(medians, key=medians.__getitem__)
    return {"sentences_per_s": medians[best], "plan": best, "by_plan": medians}
