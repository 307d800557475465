"""The public API takes JSON only: any other body on a JSON endpoint is a 415 with a message; and the
multipart upload takes a well-formed multipart body only (400 otherwise).

BentoML 1.4.39 parses a ``text/plain`` body as JSON and answers 200, so a client sending the wrong
content type would not find out; a pickle body (the inter-service transport) must never be decoded
on the public port; and a malformed multipart body made BentoML's form parser raise, a 500 (found by
fuzzing the upload). The upload's body is parsed here first, with the parser BentoML uses
(Starlette's), and handed on unchanged when it parses.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request

from serving.hot_path import is_json, media_of, replay

UPLOAD_PATH = "/tenants/upload"


class JsonOnly:
    # The lean path (serving/hot_path.py) takes JSON bodies only (pickle on internal services) and
    # hands every other body to BentoML's app, where this middleware answers it.
    lean_path_safe = True

    def __init__(
        self,
        app: Any,
        multipart_paths: frozenset[str] = frozenset(),
        skip_prefix: str | tuple[str, ...] | None = None,
    ) -> None:
        """``multipart_paths``: the routes that take multipart bodies (the upload, when served).
        ``skip_prefix``: routes that check their own content type (OpenAI's, in OpenAI's shape)."""
        self.app = app
        self.multipart_paths = multipart_paths
        self.skip_prefix = skip_prefix

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or (self.skip_prefix is not None and scope["path"].startswith(self.skip_prefix))
        ):
            await self.app(scope, receive, send)
            return
        content_type = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
        if scope["path"] not in self.multipart_paths:
            if not is_json(content_type):
                await _refuse(send, 415, "unsupported content type: send a JSON body",
                              f"content-type: expected application/json, got {_shown(content_type)}")  # fmt: skip
                return
            await self.app(scope, receive, send)
            return
        if media_of(content_type) != b"multipart/form-data":
            await _refuse(send, 415, "unsupported content type: send a multipart/form-data body",
                          f"content-type: expected multipart/form-data, got {_shown(content_type)}")  # fmt: skip
            return
        body = await Request(scope, receive).body()
        try:
            form = await Request(scope, replay(body)).form()
            await form.close()
        # Starlette turns its parser's MultiPartException into an HTTPException when the scope
        # holds an app (it does, in a server); the bare form is what it raises elsewhere. Left
        # uncaught, the HTTPException hung the request until the traffic timeout (30 s), then 500.
        except (HTTPException, MultiPartException, ValueError, UnicodeDecodeError) as exc:
            detail = getattr(exc, "detail", None) or getattr(exc, "message", None) or str(exc)
            await _refuse(send, 400, "malformed multipart body", str(detail)[:200])
            return
        await self.app(scope, replay(body), send)


def _shown(content_type: bytes) -> str:
    return content_type.decode("latin-1")[:60] or "none"


async def _refuse(send: Any, status: int, error: str, detail: str) -> None:
    body = json.dumps({"error": error, "detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
