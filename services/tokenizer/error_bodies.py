"""One error format on the public port: ``{"error": str, "detail": str}``, as the OpenAPI schema says.

BentoML 1.4.39 documents every 4xx body as that object, but sends a request validation error's
``detail`` as a list of pydantic errors, and other 4xx bodies (malformed JSON, for instance) wrapped
in a one-element list. Clients coded against the schema break on both; the fuzzing test caught it.
This middleware rewrites those bodies only (4xx with a JSON body): success responses stream through
untouched.
"""

from __future__ import annotations

import json
from typing import Any

Scope = dict[str, Any]


def conform(body: bytes) -> bytes:
    try:
        data = json.loads(body)
    except ValueError:
        return body
    if isinstance(data, list) and len(data) == 1 and isinstance(data[0], dict):
        data = data[0]
    if not isinstance(data, dict):
        return body
    detail = data.get("detail")
    if isinstance(detail, list):  # pydantic's errors: "field.sub: message; ..."
        data["detail"] = "; ".join(
            f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg', '')}"
            if isinstance(e, dict)
            else str(e)
            for e in detail
        )
    return json.dumps(data).encode()


class ConformingErrors:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: dict[str, Any] | None = None
        chunks: list[bytes] = []

        async def relay(message: dict[str, Any]) -> None:
            nonlocal held
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers", []))
                if 400 <= message["status"] < 500 and headers.get(b"content-type", b"").startswith(
                    b"application/json"
                ):
                    held = message  # send it once the body is rewritten
                    return
            elif held is not None and message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                body = conform(b"".join(chunks))
                headers = [(k, v) for k, v in held["headers"] if k.lower() != b"content-length"]
                headers.append((b"content-length", str(len(body)).encode()))
                await send({**held, "headers": headers})
                message = {"type": "http.response.body", "body": body}
            await send(message)

        await self.app(scope, receive, relay)
