"""What an expert writes by hand in ~100 lines: one Starlette app on uvicorn (httptools, uvloop),
ONNX Runtime, and a simple dynamic batcher that sorts by length.

Requests are tokenized on the event loop and queued; one loop takes everything waiting (up to
``MAX_ROWS`` sentences), sorts it by length, runs it in sub-batches of at most ``BATCH_TOKENS``
padded tokens on the engine thread, and answers each request. No admission control, no deadlines,
no metrics: the baseline a stack has to beat for its features to be worth their cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from models import encoder
from serving.features import pad, tokenize

MAX_ROWS = 256  # sentences taken per round
# Padded tokens per engine call, after sorting by length. A fixed row count (32, this server's
# first version) let one long sentence pad a whole sub-batch of short ones; on CPU a batch saves
# little per sentence beyond the call's overhead, and padding costs in full.
BATCH_TOKENS = 512

# ORT's intra-op threads spin while they wait for work; on 2 cores that takes a core from the
# event loop, which tokenizes and answers the next requests while the engine runs. (The FastAPI
# baseline keeps the default: its loop waits for each engine call.) `make bench` records what
# this server serves with this and the cut above.
tokenizer, engine, spec = encoder.load(spinning=False)
executor = ThreadPoolExecutor(1)
queue: asyncio.Queue[tuple[list[list[int]], asyncio.Future]] = asyncio.Queue()


def run_sorted(sequences: list[list[int]]) -> np.ndarray:
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out = np.empty((len(sequences), spec.dim), dtype=np.float32)
    rows: list[int] = []
    for i in order:  # ascending length: the newest row is the widest
        if rows and (len(rows) + 1) * len(sequences[i]) > BATCH_TOKENS:
            out[rows] = engine(pad([sequences[r] for r in rows], spec.pad_id, spec.token_types))
            rows = []
        rows.append(i)
    out[rows] = engine(pad([sequences[r] for r in rows], spec.pad_id, spec.token_types))
    return out


async def batcher() -> None:
    loop = asyncio.get_running_loop()
    while True:
        taken = [await queue.get()]
        rows = len(taken[0][0])
        while not queue.empty() and rows < MAX_ROWS:
            taken.append(queue.get_nowait())
            rows += len(taken[-1][0])
        sequences = [seq for ids, _ in taken for seq in ids]
        try:
            vectors = await loop.run_in_executor(executor, run_sorted, sequences)
        except Exception as exc:
            for _, future in taken:
                future.set_exception(exc)
            continue
        start = 0
        for ids, future in taken:
            if not future.done():
                future.set_result(vectors[start : start + len(ids)])
            start += len(ids)


async def embed(request: Request) -> Response:
    try:
        texts = json.loads(await request.body())["texts"]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError
    except (ValueError, KeyError, TypeError):
        return JSONResponse({"error": 'send {"texts": [str, ...]}'}, status_code=400)
    future = asyncio.get_running_loop().create_future()
    await queue.put((tokenize(tokenizer, texts), future))
    vectors = await future
    return Response(json.dumps({"embeddings": vectors.tolist()}), media_type="application/json")


async def health(_: Request) -> Response:
    return JSONResponse({"ok": True})


@contextlib.asynccontextmanager
async def lifespan(_: Starlette) -> AsyncIterator[None]:
    task = asyncio.get_running_loop().create_task(batcher())
    yield
    task.cancel()


app = Starlette(
    routes=[Route("/embed", embed, methods=["POST"]), Route("/health", health)], lifespan=lifespan
)
