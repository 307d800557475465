"""What both embedding runners (ONNX, TF) do around their engines: batchers, warm-up, the API body."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from serving.batching import Batcher, Engine, Lanes, Policy
from serving.batching.metrics import Recorder
from serving.features import pad
from serving.protocol import EmbedResult, timing_headers


def calibrate(engine: Engine, rows: int = 16, length: int = 32) -> float:
    """Warm the engine up and measure its speed (tokens/s), the admission estimate's first value."""
    feeds = pad([[101] + [1000] * (length - 2) + [102]] * rows)
    engine(feeds)  # first call: allocations, kernel selection
    started = time.perf_counter()
    for _ in range(2):
        engine(feeds)
    return 2 * rows * length / (time.perf_counter() - started)


def batchers(
    runner: str,
    engines: Mapping[str, Engine],
    policy: Policy,
    lanes: int = 1,
    solos: Mapping[str, Engine] | None = None,
) -> dict[str, Batcher]:
    """One batcher per model, all sharing the instance's ``lanes``: calls of every model together
    never run on more lanes than the instance has cores for. ``solos``: each model's engine for a
    call that runs alone (serving/batching/batcher.py)."""
    shared = Lanes(lanes, f"{runner}-engine")
    solos = solos or {}
    made = {}
    for name, engine in engines.items():
        if name in solos:
            calibrate(engine)  # warm the lanes' session up too
        made[name] = Batcher(
            engine,
            policy,
            lanes=shared,
            solo=solos.get(name),
            recorder=Recorder(runner, name),
            # The instance's speed: a solo engine has every core, as a loaded instance has.
            tokens_per_s=calibrate(solos.get(name, engine)),
        )
    return made


async def embed(
    batcher: Batcher, ids: list[list[int]], ctx: Any, deadline_s: float | None = None
) -> EmbedResult:
    rows, timing = await batcher.submit(ids, deadline_s)
    queue_ms, inference_ms = timing.queue_s * 1000, timing.inference_s * 1000
    ctx.response.headers.update(timing_headers(queue_ms, inference_ms))
    return EmbedResult(
        embeddings=rows,
        queue_ms=queue_ms,
        inference_ms=inference_ms,
        engine_calls=timing.engine_calls,
    )
