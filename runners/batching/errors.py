"""Load shedding: 429 (queue full) or 503 (deadline), always with Retry-After."""

from __future__ import annotations

import math
from typing import Any

from runners.errors import ApiError


class Overloaded(ApiError):
    """The request cannot be served in time."""

    def __init__(self, status: int, retry_after: float, reason: str) -> None:
        super().__init__(reason, status)
        self.retry_after = max(1, math.ceil(retry_after))
        self.reason = reason

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}

    def body(self) -> dict[str, Any]:
        return {"error": self.reason, "retry_after": self.retry_after}


class QueueFull(Overloaded):
    def __init__(self, retry_after: float, reason: str) -> None:
        super().__init__(429, retry_after, reason)


class DeadlineExceeded(Overloaded):
    def __init__(self, retry_after: float, reason: str) -> None:
        super().__init__(503, retry_after, reason)
