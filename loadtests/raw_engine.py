"""The limit: the engine in this process, no HTTP (tokenize + ONNX session), per model and backend.

The best of every plan (length-sorted batches of a fixed row count, and the stack's own planner,
``serving.batching.plan``, under padded-token budgets) on both thread layouts (one session on
every core; one-thread sessions on every core at once, the stack's lanes): loadtests/README.md.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

# The sweep reaches past every best plan a record has found (``at_edge`` warns at an end).
ROW_COUNTS = (4, 8, 16, 32, 64, 128)
TOKEN_BUDGETS = (128, 256, 512, 1024, 2048, 4096)
# A quick run (CI) times one plan of each kind (the stack's own budget, 1024), on fewer texts.
QUICK_PLANS = (8,), (1024,)


def sample(texts: list[str], limit: int | None) -> list[str]:
    """Every k-th text in length order, at least ``limit`` of them: the corpus's own lengths. The
    served points draw from the whole corpus, so a limit measured on texts longer than its average
    would sit below what the stack serves, and the run would fail as "served above raw"."""
    if limit is None or limit >= len(texts):
        return texts
    return sorted(texts, key=len)[:: len(texts) // limit]


def raw_engine(
    model: str,
    backend: str,
    repeats: int,
    texts_limit: int | None = None,
    quick: bool = False,
    inputs: list[str] | list[tuple[str, str]] | None = None,
) -> dict:
    """Inputs/s of one catalogue model's ONNX ``backend`` (onnx, onnx-int8) alone, with its own
    tokenizer, on ``inputs`` (a rerank model's are (query, text) pairs, encoded as it encodes a
    pair) or else the load-test corpus (about ``texts_limit`` of its texts), with ``QUICK_PLANS``
    in a quick run: the best plan, its median rate (``sentences_per_s``: a pair is one input)."""
    from models import corpus, store
    from serving import catalogue
    from serving.batching import plan
    from serving.engines.onnx import OnnxEngine
    from serving.features import load_tokenizer, pad, tokenize, tokenize_pairs
    from serving.served import spec_of

    entry = catalogue.current().get(model)
    if entry is None or backend not in entry.backends:
        raise SystemExit(f"error: {model} on {backend} is not in {catalogue.path()}")
    stored = store.latest(entry.store_name(backend))
    spec = spec_of(stored)
    cores = os.cpu_count() or 2
    path = Path(stored.path_of("model.onnx"))
    providers = ["CPUExecutionProvider"]
    wide = OnnxEngine(path, spec.contract(), threads=cores, providers=providers)
    lane = OnnxEngine(path, spec.contract(), threads=1, providers=providers)
    tokenizer_file = Path(store.latest(entry.store_name("tokenizer")).path) / "tokenizer.json"
    pairs = entry.task == "rerank"
    tokenizer = load_tokenizer(tokenizer_file, spec.max_length, pairs=pairs)
    if inputs is None:
        inputs = sample(corpus.load_texts(), texts_limit)
    Row = tuple[list[int], int]  # a sequence's ids, and where a pair's second text starts

    def encoded() -> list[Row]:
        if not pairs:
            return [(ids, 0) for ids in tokenize(tokenizer, cast("list[str]", inputs))]
        ids, starts = tokenize_pairs(tokenizer, cast("list[tuple[str, str]]", inputs))
        return list(zip(ids, starts, strict=True))

    def padded(batch: list[Row]) -> dict:
        segments = [start for _, start in batch] if pairs else None
        return pad([ids for ids, _ in batch], spec.pad_id, spec.token_types, segments)

    for engine in (wide, lane):  # warm-up: allocations, kernel choice
        engine(padded(encoded()[:32]))
    lanes = ThreadPoolExecutor(max_workers=cores)

    def batches_of(rows: list[Row], kind: str, size: int) -> list[list[Row]]:
        if kind == "rows":
            ordered = sorted(rows, key=lambda row: len(row[0]))
            return [ordered[i : i + size] for i in range(0, len(ordered), size)]
        # at the ONNX runner's default weight a call (CALL_OVERHEAD_TOKENS), as its commit plans
        groups = plan([len(ids) for ids, _ in rows], max_tokens=size, max_rows=256)
        return [[rows[i] for i in group.indices] for group in groups]

    def run(batches: list[list[Row]], layout: str) -> None:
        if layout == "1 session":
            for batch in batches:
                wide(padded(batch))
        else:  # every core runs its own call, taking the next batch when done
            list(lanes.map(lambda batch: lane(padded(batch)), batches))

    layouts = ("1 session", f"{cores} lanes")
    rows, budgets = QUICK_PLANS if quick else (ROW_COUNTS, TOKEN_BUDGETS)
    plans = [("rows", n) for n in rows] + [("tokens", n) for n in budgets]
    rates: dict[str, list[float]] = defaultdict(list)  # in the order the plans are timed
    for _ in range(repeats):
        for layout in layouts:  # interleaved: a noisy moment does not favour one plan
            for kind, size in plans:
                started = time.perf_counter()
                run(batches_of(encoded(), kind, size), layout)
                seconds = time.perf_counter() - started
                rates[f"{kind} {size}, {layout}"].append(len(inputs) / seconds)
    lanes.shutdown()
    medians = {name: statistics.median(samples) for name, samples in rates.items()}
    return {"model": model, "backend": backend, **_limit(medians)}


def _limit(by_plan: dict[str, float]) -> dict:
    """The best of ``by_plan`` (each plan's rate): its rate and name, and every plan's."""
    best = max(by_plan, key=by_plan.__getitem__)
    return {"sentences_per_s": by_plan[best], "plan": best, "by_plan": by_plan}


def best_of(*runs: dict) -> dict:
    """One limit from several measurements of ``raw_engine`` (the run's start and its end): each
    plan's best median (a slower minute only ever lowers a measurement), the best plan among
    those, and each measurement as it was, in order."""
    by_plan = {name: max(run["by_plan"][name] for run in runs) for name in runs[0]["by_plan"]}
    measured = [{k: run[k] for k in ("sentences_per_s", "plan", "by_plan")} for run in runs]
    named = {key: runs[0][key] for key in ("model", "backend") if key in runs[0]}
    return {**named, **_limit(by_plan), "runs": measured}


def at_edge(plan: str) -> bool:
    """Whether a plan ("tokens 512, 2 lanes") is the smallest or largest of its kind in the sweep:
    a plan beyond it, not swept, might be faster, and the limit too low."""
    kind, size = plan.split(",")[0].split()
    sizes = ROW_COUNTS if kind == "rows" else TOKEN_BUDGETS
    return int(size) in (min(sizes), max(sizes))
