"""The public OpenAPI document, corrected where BentoML's generator leaves it short of the API.

BentoML 1.4.39 generates ``/docs.json`` from the service's signatures, but declares no request body
as required, although every JSON endpoint refuses a request without one (415: no content type; 400:
no body). Clients and schema-driven tools (the fuzzing tests among them) read such a request as
valid. ``refine`` marks each body required; ``OpenApiDocs`` applies it to ``GET /docs.json`` only
(the one response it touches; every other request passes straight through).
"""

from __future__ import annotations

import json
from typing import Any

DOCS_PATH = "/docs.json"


def refine(spec: dict[str, Any]) -> dict[str, Any]:
    for item in spec.get("paths", {}).values():
        for operation in item.values():
            if isinstance(operation, dict) and "requestBody" in operation:
                operation["requestBody"]["required"] = True
    return spec


class OpenApiDocs:
    def __init__(self, app: Any) -> None:
        self.app = app

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
            body = json.dumps(refine(json.loads(body))).encode()
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body})
