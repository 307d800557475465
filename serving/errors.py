"""Errors a service answers with a specific status, and the decorator that turns them into replies.

BentoML maps a pydantic ValidationError to 400 and anything else to a 500 that hides the message;
these carry their own status, message and headers (e.g. 404 unknown tenant, 429 with Retry-After).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable
from typing import Any


class ApiError(Exception):
    status = 500

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status

    def headers(self) -> dict[str, str]:
        return {}

    def body(self) -> dict[str, Any]:
        return {"error": self.message}

    def response(self, ctx: Any = None):
        """The HTTP reply. With a BentoML ``ctx``, its status and headers are set too: BentoML
        overwrites a returned Response's status with ``ctx.response.status_code``."""
        from starlette.responses import JSONResponse

        if ctx is not None:
            ctx.response.status_code = self.status
            ctx.response.headers.update(self.headers())
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers())


class TooManyTokens(ApiError):
    """413: one request holds more tokens than a queue ever admits."""

    status = 413


class WrongInputFormat(ApiError):
    """409: a tenant classify call sent what the tenant's current model does not take (token ids to
    a head, vectors only to a whole model): the caller learns the format and sends the other."""

    status = 409


class Overloaded(ApiError):
    """Load shedding: the request cannot be served in time. Always carries Retry-After."""

    def __init__(self, status: int, retry_after: float, reason: str) -> None:
        super().__init__(reason, status)
        self.retry_after = max(1, math.ceil(retry_after))
        self.reason = reason

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}

    def body(self) -> dict[str, Any]:
        return {"error": self.reason, "retry_after": self.retry_after}


class QueueFull(Overloaded):
    """429: the queue holds its limit of tokens."""

    def __init__(self, retry_after: float, reason: str) -> None:
        super().__init__(429, retry_after, reason)


class DeadlineExceeded(Overloaded):
    """503: the request cannot finish (or did not start) within its deadline."""

    def __init__(self, retry_after: float, reason: str) -> None:
        super().__init__(503, retry_after, reason)


def replies_on_error(api: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Wrap an async BentoML API taking ``ctx``: an ``ApiError`` becomes its reply."""

    @functools.wraps(api)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await api(*args, **kwargs)
        except ApiError as exc:
            return exc.response(kwargs.get("ctx"))

    return wrapper
