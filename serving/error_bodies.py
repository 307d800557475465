"""One error format on every service's API: ``{"error": str, "detail": str}``, as the OpenAPI schema says.

BentoML 1.4.39 documents every 4xx body as that object, but sends a request validation error's
``detail`` as a list of pydantic errors, and other 4xx bodies (malformed JSON, for instance) wrapped
in a one-element list. Clients coded against the schema break on both; the fuzzing test caught it.
Both also name internal classes ("1 validation error for EmbedRequestIODescriptor"). This middleware
rewrites those bodies only (4xx with a JSON body): success responses stream through untouched.
Every service installs it (the runners' ports are reachable too, one container each); OpenAI's
routes on the public service keep OpenAI's error shape (``skip_prefix``).
"""

from __future__ import annotations

import json
import re
from typing import Any

Scope = dict[str, Any]
# pydantic's summary line names the class it validated ("1 validation error for
# EmbedRequestIODescriptor"): an internal name that means nothing to a client.
_PYDANTIC_SUMMARY = re.compile(r"^(\d+) validation errors? for \S+$")


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
            f"{'.'.join(map(str, e.get('loc', ()))) or 'body'}: {e.get('msg', '')}"
            if isinstance(e, dict)
            else str(e)
            for e in detail
        )
    elif isinstance(detail, str) and detail.startswith(": "):  # an error of the body as a whole
        data["detail"] = "body" + detail
    error = data.get("error")
    if isinstance(error, str) and (summary := _PYDANTIC_SUMMARY.match(error)):
        count = int(summary.group(1))
        data["error"] = f"invalid request: {count} problem{'s' if count > 1 else ''} (see detail)"
    return json.dumps(data).encode()


class ConformingErrors:
    # The lean path (serving/hot_path.py) runs a copy of this middleware around its own answers.
    lean_path_safe = True

    def __init__(self, app: Any, skip_prefix: str | tuple[str, ...] | None = None) -> None:
        """``skip_prefix``: paths answered in another documented shape (OpenAI's, under /v1/)."""
        self.app = app
        self.skip_prefix = skip_prefix

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or (
            self.skip_prefix is not None and scope["path"].startswith(self.skip_prefix)
        ):
            await self.app(scope, receive, send)
            return
        held: dict[str, Any] | None = None
        chunks: list[bytes] = []

        async def relay(message: dict[str, Any]) -> None:
            nonlocal held
            if message["type"] == "http.response.start" and 400 <= message["status"] < 500:
                named = dict(message.get("headers", []))
                if named.get(b"content-type", b"").startswith(b"application/json"):
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
