"""Requests wait for a runner that has no replica up, instead of being refused.

A runner service scaled to zero (Swarm, compose), or with every replica restarting, has no replica
to answer: the proxy in front of it answers 503 marked ``no_replica`` (deploy/proxy/haproxy.cfg),
and a runner reached directly refuses the connection. Either way the call never reached an engine,
so it can be sent again. Refusing the request instead would leave every client to wait and retry on
its own, each at its own pace; scale-from-zero would mean a burst of errors at each first request.

Why here and not in the proxy: the tokenizer already knows each request's budget and the runner's
answers, and the same wait covers a runner reached without a proxy (a URL, the development graph).
HAProxy alone can only answer 503 when no server is up; holding requests there would take Lua.

How: the first call that finds no replica closes the gate. While it is closed, requests wait, at
most ``max_waiting`` of them (more get 503 at once) and each at most ``wait_s`` (then 503). One
waiter at a time tries its call again, at most every ``retry_s``; the first call answered opens
the gate, and every waiter goes through. A request that waited starts its deadline again when it
is sent: the wait is the runner's start, not the request's work. Once through, the waiters meet
admission as any burst does (a burst beyond the queue's bound gets 429). The bounds hold per
gate, in each worker process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from services.tokenizer.clients import NoReplica

logger = logging.getLogger("bento_bundle.tokenizer")

T = TypeVar("T")


class ReplicaWait:
    """The gate in front of one runner's calls (see the module's docstring)."""

    def __init__(self, runner: str, wait_s: float, max_waiting: int, retry_s: float = 0.5) -> None:
        self.runner = runner
        self.wait_s, self.max_waiting, self.retry_s = wait_s, max_waiting, retry_s
        self.waiting = 0  # requests waiting now
        self.waited = 0  # requests that waited since the gate last closed
        # While closed: a future the first answer sets. While a waiter tries its call: a future
        # set when it stops, answered or not. Made in the loop that uses the gate.
        self._opened: asyncio.Future[None] | None = None
        self._trying: asyncio.Future[None] | None = None
        self._closed_at = self._last_try = 0.0

    @property
    def up(self) -> bool:
        return self._opened is None

    async def call(self, send: Callable[[], Awaitable[T]]) -> T:
        """``send()``'s answer, waiting for a replica while the runner has none."""
        if self.up:
            try:
                return await send()
            except NoReplica:
                if self.wait_s <= 0:
                    raise
                self._close()
        if self.waiting >= self.max_waiting:
            raise NoReplica(self.runner, f"{self.waiting} requests already wait for one")
        self.waiting += 1
        self.waited += 1
        try:
            return await self._wait_then_send(send, time.monotonic() + self.wait_s)
        finally:
            self.waiting -= 1

    async def _wait_then_send(self, send: Callable[[], Awaitable[T]], until: float) -> T:
        while True:
            left = until - time.monotonic()
            if left <= 0:
                raise NoReplica(self.runner, f"none came up within {self.wait_s:g} s")
            if self._opened is None:  # open: go, like any request
                try:
                    return await send()
                except NoReplica:
                    self._close()  # gone again: wait on, counted in this closure
                    self.waited += 1
                    continue
            if self._trying is not None:  # another waiter tries: until it opens the gate or stops
                wake = {self._opened, self._trying}
                await asyncio.wait(wake, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                continue
            self._trying = asyncio.get_running_loop().create_future()
            try:
                pause = self._last_try + self.retry_s - time.monotonic()
                if pause >= left:
                    await asyncio.sleep(left)
                    continue
                if pause > 0:
                    await asyncio.sleep(pause)
                self._last_try = time.monotonic()
                result = await send()
            except NoReplica:
                continue
            finally:
                self._trying.set_result(None)
                self._trying = None
            # Only an answer opens the gate: an error may be this side's (its queue) or a runner
            # that is not up after all (a timeout); the next waiter tries again.
            self._open()
            return result

    def _close(self) -> None:
        if self._opened is None:
            self._opened = asyncio.get_running_loop().create_future()
            self._closed_at = self._last_try = time.monotonic()
            self.waited = 0
            logger.warning(
                "%s has no replica up: requests wait for one, up to %g s each",
                self.runner, self.wait_s,
            )  # fmt: skip

    def _open(self) -> None:
        if self._opened is not None:
            self._opened.set_result(None)
            self._opened = None
            logger.warning(
                "%s answers again after %.1f s; %d requests waited for it",
                self.runner, time.monotonic() - self._closed_at, self.waited,
            )  # fmt: skip
