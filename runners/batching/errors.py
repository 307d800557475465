"""Load shedding as an exception that every service turns into the same HTTP response."""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable
from typing import Any


class Overloaded(Exception):
    """The request cannot be served in time: 429 (queue full) or 503 (deadline), with Retry-After."""

    def __init__(self, status: int, retry_after: float, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.retry_after = max(1, math.ceil(retry_after))
        self.reason = reason

    def body(self) -> dict[str, Any]:
        return {"error": self.reason, "retry_after": self.retry_after}

    def response(self, ctx: Any = None):
        """The HTTP reply. With a BentoML ``ctx``, its status and headers are set too: BentoML
        overwrites a returned Response's status with ``ctx.response.status_code``."""
        from starlette.responses import JSONResponse

        headers = {"Retry-After": str(self.retry_after)}
        if ctx is not None:
            ctx.response.status_code = self.status
            ctx.response.headers.update(headers)
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


class QueueFull(Overloaded):
    def __init__(self, retry_after: float, reason: str) -> None:
        super().__init__(429, retry_after, reason)


class DeadlineExceeded(Overloaded):
    def __init__(self, retry_after: float, reason: str) -> None:
        super().__init__(503, retry_after, reason)


def replies_on_overload(api: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Wrap an async BentoML API taking ``ctx``: an ``Overloaded`` becomes its 429/503 reply."""

    @functools.wraps(api)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await api(*args, **kwargs)
        except Overloaded as exc:
            return exc.response(kwargs.get("ctx"))

    return wrapper
