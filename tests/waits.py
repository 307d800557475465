"""Waiting in a test for a state, not for a guess at how long it takes to come."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Yield to the event loop until ``condition()`` holds; fail after ``timeout_s``, which bounds
    a hang only (a loaded host is slower, never wrong)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the state waited for never came"
        await asyncio.sleep(0.001)
