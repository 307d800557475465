"""The benchmark's rerank and classify rows: the catalogue's first model of each task, served by
the stack (``/rerank``: a query and 32 texts a request; ``/predict``: 32 texts), against the same
model's raw engine on the same inputs (the pairs, or the texts, of the bodies the requests cycle
through), with the CPU each request cost every process of the graph. A served figure above its raw
limit fails the run as an embedding row's does (``report.above_raw``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import cast

from loadtests import loadgen
from loadtests.points import loaded
from loadtests.raw_engine import raw_engine
from models import corpus
from testkit.processes import Server

PER_REQUEST = loadgen.BULK  # texts a request: pairs of one query for /rerank
ROUTES = {"rerank": "/rerank", "classify": "/predict"}
# The requests cycle through these bodies, and the raw engine times every plan on their inputs
# (320): served and raw compute the same pairs. Nothing in the stack caches a result.
BODIES = 10


Inputs = list[str] | list[tuple[str, str]]  # one request's texts, or its (query, text) pairs


def bodies(task: str, model: str, out: Path) -> tuple[Path, list[Inputs]]:
    """``BODIES`` request bodies of ``task`` for ``model``, one JSON per line, and the inputs each
    holds in order: (query, text) pairs for rerank, texts for classify."""
    texts = corpus.load_texts()
    rng = random.Random(11)
    lines: list[str] = []
    inputs: list[Inputs] = []
    for i in range(BODIES):
        chosen = rng.sample(texts, PER_REQUEST)
        if task == "rerank":
            query = texts[i % len(texts)]
            lines.append(json.dumps({"query": query, "texts": chosen, "model": model}))
            inputs.append([(query, text) for text in chosen])
        else:
            lines.append(json.dumps({"inputs": chosen, "model": model}))
            inputs.append(chosen)
    path = out / "bodies" / f"{task}-{model}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path, inputs


def measure(server: Server, out: Path, users: int, seconds: float, quick: bool) -> list[dict]:
    """One row for each task the catalogue has a model for, at ``users`` closed-loop clients."""
    from serving import catalogue

    rows = []
    for task, route in ROUTES.items():
        entry = catalogue.current().default(task)
        if entry is None:
            print(f"  {task}: no {task} model in {catalogue.path()}: no row", flush=True)
            continue
        backend = entry.backends[0]  # what the route serves the model on
        if backend not in ("onnx", "onnx-int8"):  # the raw engine is ONNX Runtime's
            print(
                f"  {task}: {entry.name} is served on {backend}: no raw engine, no row", flush=True
            )
            continue
        path, inputs = bodies(task, entry.name, out)
        raw_inputs = cast(Inputs, [x for body in inputs for x in body])  # one kind, as each body
        raw = raw_engine(entry.name, backend, 1 if quick else 3, quick=quick, inputs=raw_inputs)
        loadgen.run(server.url, route, path, users, 2)  # warm-up: the model's first batches
        load, cpu_ms = loaded(server, route, path, users, seconds)
        served = load.ok * PER_REQUEST / load.seconds
        rows.append({
            "task": task, "model": entry.name, "route": route, "users": users,
            "inputs_per_request": PER_REQUEST, "served_per_s": round(served, 1),
            "raw_per_s": round(raw["sentences_per_s"], 1), "raw_plan": raw["plan"],
            "served_over_raw": round(served / raw["sentences_per_s"], 3),
            "p50_ms": load.p50_ms, "p99_ms": load.p99_ms, "failures": load.failed,
            "shed": load.shed, "cpu_ms_per_request": cpu_ms,
        })  # fmt: skip
        print(
            f"  {task:<8} {entry.name}: {served:.0f} {'pairs' if task == 'rerank' else 'texts'}/s "
            f"served, raw {raw['sentences_per_s']:.0f} ({raw['plan']}), p50 {load.p50_ms:.0f} ms, "
            f"{load.failed} failed, {load.shed} shed",
            flush=True,
        )
    return rows
