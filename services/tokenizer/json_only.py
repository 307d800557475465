"""The public API takes JSON only: any other body on a JSON endpoint is a 415 with a message.

BentoML 1.4.39 parses a ``text/plain`` body as JSON and answers 200, so a client sending the wrong
content type would not find out; and a pickle body (the inter-service transport) must never be
decoded on the public port. Multipart endpoints (the model upload) are left to BentoML.
"""

from __future__ import annotations

import json
from typing import Any

MULTIPART_PATHS = frozenset({"/tenants/upload"})


def _is_json(content_type: bytes) -> bool:
    media = content_type.split(b";")[0].strip().lower()
    return media == b"application/json" or media.endswith(b"+json")


class JsonOnly:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] not in MULTIPART_PATHS
        ):
            content_type = dict(scope.get("headers", [])).get(b"content-type", b"")
            if not _is_json(content_type):
                await self._refuse(send, content_type)
                return
        await self.app(scope, receive, send)

    @staticmethod
    async def _refuse(send: Any, content_type: bytes) -> None:
        given = content_type.decode("latin-1")[:60] or "none"
        body = json.dumps(
            {
                "error": "unsupported content type: send a JSON body",
                "detail": f"content-type: expected application/json, got {given}",
            }
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 415, "headers": headers})
        await send({"type": "http.response.body", "body": body})
