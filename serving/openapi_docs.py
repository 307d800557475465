"""Corrections to the OpenAPI document BentoML generates, applied where it is served.

BentoML 1.4.39 builds ``/docs.json`` from each service's API signatures only: routes mounted beside
them (OpenAI's on the public service, TF Serving's on the runners) are missing, and so are request
examples. ``OpenApiDocs`` passes every request straight through except ``GET /docs.json``, whose
body it hands to the service's own ``refine`` function.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("bento_bundle.openapi")
DOCS_PATH = "/docs.json"
Refine = Callable[[dict[str, Any]], dict[str, Any]]


class OpenApiDocs:
    # It changes GET /docs.json only; the lean path (serving/hot_path.py) answers POSTs.
    lean_path_safe = True

    def __init__(self, app: Any, refine: Refine) -> None:
        self.app = app
        self.refine = refine

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != DOCS_PATH:
            await self.app(scope, receive, send)
            return
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def hold(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, hold)
        body = b"".join(chunks)
        if start.get("status") == 200:
            try:
                body = json.dumps(self.refine(json.loads(body))).encode()
            except Exception:  # the document as BentoML made it, rather than no answer at all
                logger.exception("refining %s failed; serving it unrefined", DOCS_PATH)
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body})
