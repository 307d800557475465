"""What the engine runners (ONNX, TF) do around their engines, for every model they serve: one batcher
per model and backend on the instance's shared lanes, the warm-up, the API body.

A model is keyed by its catalogue name and backend; its metrics are labelled ``name/backend``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from serving.batching import Batcher, Engine, Lanes, Policy
from serving.batching.metrics import Recorder
from serving.catalogue import ModelSpec
from serving.errors import ApiError
from serving.features import pad
from serving.protocol import EmbedResult, check_ids, check_segments, timing_headers
from serving.startup import Startup

Key = tuple[str, str]  # (model name, backend)


def label(key: Key) -> str:
    return "/".join(key)


def calibrate(engine: Engine, spec: ModelSpec, rows: int = 16, length: int = 32) -> float:
    """Warm the engine up and measure its speed (tokens/s), the admission estimate's first value."""
    token = min(1000, spec.vocab_size - 1)
    feeds = pad([[token] * min(length, spec.max_length)] * rows, spec.pad_id, spec.token_types)
    engine(feeds)  # first call: allocations, kernel selection
    started = time.perf_counter()
    for _ in range(2):
        engine(feeds)
    return 2 * rows * length / (time.perf_counter() - started)


def batchers(
    runner: str,
    engines: Mapping[Key, Engine],
    specs: Mapping[Key, ModelSpec],
    policy: Policy,
    lanes: int = 1,
    solos: Mapping[Key, Engine] | None = None,
) -> dict[Key, Batcher]:
    """One batcher per model and backend, each with its own queue, all sharing the instance's
    ``lanes``: calls of every model together never run on more lanes than the instance has cores
    for, and a lane that frees goes to the batcher with the least work to do (a model saturated
    with bulk requests does not hold every lane while another waits). ``solos``: each model's
    engine for a call that runs alone (serving/batching/batcher.py)."""
    shared = Lanes(lanes, f"{runner}-engine")
    solos = solos or {}
    made = {}
    for key, engine in engines.items():
        spec = specs[key]
        if key in solos:
            calibrate(engine, spec)  # warm the lanes' session up too
        made[key] = Batcher(
            engine,
            policy,
            lanes=shared,
            solo=solos.get(key),
            recorder=Recorder(runner, label(key)),
            pad_id=spec.pad_id,
            token_types=spec.token_types,
            # The instance's speed: a solo engine has every core, as a loaded instance has.
            tokens_per_s=calibrate(solos.get(key, engine), spec),
        )
    return made


async def warm_up(
    batchers: Mapping[Key, Batcher], specs: Mapping[Key, ModelSpec], startup: Startup
) -> None:
    """A runner's start-up hook, after ``__init__`` (which has no event loop to submit from) and
    before BentoML answers its /readyz: a chat-sized and a bulk-sized request through each batcher,
    as a request goes (the queue, the planner, the lanes' threads, the engine); then the start is
    logged. An engine warmed from the main thread alone still paid, on the first request, for the
    lane thread's first call."""
    with startup.part("warm_up"):
        for key, batcher in batchers.items():
            spec = specs[key]
            token = min(1000, spec.vocab_size - 1)
            with batcher.admission.unmeasured():  # the speed stays calibrate's
                for rows, length in ((1, 8), (16, 32)):
                    await batcher.submit([[token] * min(length, spec.max_length)] * rows)
    startup.done()


def pick(batchers: Mapping[Key, Batcher], model: str, backend: str) -> Batcher:
    """The batcher of ``model`` on ``backend``, or a 404 naming what this runner serves."""
    found = batchers.get((model, backend))
    if found is None:
        served = sorted({f"{name} ({b})" for name, b in batchers})
        raise ApiError(
            f"model {model!r} on {backend} is not served by this runner (it serves: "
            f"{', '.join(served)})",
            404,
        )
    return found


async def embed(
    batcher: Batcher,
    spec: ModelSpec,
    ids: list[list[int]],
    ctx: Any,
    deadline_s: float | None = None,
    segments: list[int] | None = None,
) -> EmbedResult:
    check_ids(ids, spec)
    if segments is not None:
        check_segments(ids, segments)
    rows, timing = await batcher.submit(ids, deadline_s, segments)
    queue_ms, inference_ms = timing.queue_s * 1000, timing.inference_s * 1000
    ctx.response.headers.update(timing_headers(queue_ms, inference_ms))
    return EmbedResult(
        embeddings=rows,
        queue_ms=queue_ms,
        inference_ms=inference_ms,
        engine_calls=timing.engine_calls,
    )
