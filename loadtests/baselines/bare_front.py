"""A front door's floor on this host: the least CPU one chat request can cost before any serving
feature, for ``make profile`` to set the tokenizer's own CPU per request beside.

    [BARE_FRONT_HOLD_S=0.3] uvicorn loadtests.baselines.bare_front:app --host 127.0.0.1 \
        --port 8000 --http httptools --loop uvloop --no-access-log

One Starlette route on uvicorn (httptools, uvloop), one process: it reads ``{"texts": [...]}``,
tokenizes the texts with the stack's tokenizer, and answers a body like /embed's (each text's
384 floats, written by orjson from float32 as the stack writes them, and its token count; not the
backend's name). It runs no engine: every answer holds the same stored unit vector, so it is no
baseline a user could pick, only the price of HTTP, JSON and tokenizing here. What the tokenizer
spends beyond it is the stack's own: validation, the coalescing queue, the hop to the runner and
back, metrics, BentoML's context, and sharing the cores with the engine.

``BARE_FRONT_HOLD_S`` holds each answer that long (a timer per request) before writing it: under
the same connections, the route then answers at the rate the stack did, whose answers wait for
the engine. A request's CPU depends on the rate (``make profile`` measures both, and counts the
loop's wake-ups at each); the hold's timer is part of what the held route spends.
"""

from __future__ import annotations

import asyncio
import os

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from models import store
from serving import contracts
from serving.features import load_tokenizer, tokenize
from serving.replies import dumps

tokenizer = load_tokenizer(store.path_of(contracts.TOKENIZER) / "tokenizer.json")
HOLD_S = float(os.environ.get("BARE_FRONT_HOLD_S", "0"))
# Rows sliced from one block (C-contiguous, so orjson writes them itself, as the stack's replies
# are): no copy per request for up to this many texts.
_ROWS = np.full((64, contracts.EMBEDDING_DIM), contracts.EMBEDDING_DIM**-0.5, dtype=np.float32)


async def embed(request: Request) -> Response:
    try:
        texts = orjson.loads(await request.body())["texts"]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError
    except (ValueError, KeyError, TypeError):
        return JSONResponse({"error": 'send {"texts": [str, ...]}'}, status_code=400)
    ids = tokenize(tokenizer, texts)
    if HOLD_S > 0:
        await asyncio.sleep(HOLD_S)
    if len(ids) <= len(_ROWS):
        vectors = _ROWS[: len(ids)]
    else:
        vectors = np.full((len(ids), contracts.EMBEDDING_DIM), _ROWS[0, 0], dtype=np.float32)
    body = {"embeddings": vectors, "tokens": [len(i) for i in ids]}
    return Response(dumps(body), media_type="application/json")


async def health(_: Request) -> Response:
    return JSONResponse({"ok": True})


app = Starlette(routes=[Route("/embed", embed, methods=["POST"]), Route("/health", health)])
