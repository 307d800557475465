"""The load driver of chaos and soak: ``Driver.open`` sends arrivals at a fixed rate whatever the
answers do (Locust's users and wrk's connections are closed loops, which never offer more than the
server serves); ``Driver.closed`` runs a closed loop, to find what the server serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

# The reasons admission gives when it refuses a request on arrival (serving/batching/admission.py).
ADMISSION_REASONS = ("queue full", "cannot finish within")

Request = tuple[str, dict[str, Any]]  # path, JSON body


@dataclass
class Outcome:
    path: str
    sent: float
    latency_s: float
    status: int  # 0: no HTTP answer (reset, timeout); -1: a 200 with a wrong answer
    retry_after: str | None = None
    error: str = ""
    expired: bool = False  # a 503: admitted, and its deadline passed while it waited
    at_admission: bool = False  # a 429/503 whose reason is admission's (not a runner down)


def refusal(status: int, body: str) -> tuple[bool, bool]:
    """(expired while waiting, refused at admission), by the reason the server gives."""
    expired = status == 503 and "deadline passed" in body
    at_admission = status in (429, 503) and any(reason in body for reason in ADMISSION_REASONS)
    return expired, at_admission


class Driver(contextlib.AbstractAsyncContextManager["Driver"]):
    """Requests to one server: ``make`` draws each request, ``check`` says why a 200 is wrong
    ('' when right). Idle connections are dropped before the servers' 5 s keep-alive timeout."""

    def __init__(
        self,
        url: str,
        make: Callable[[random.Random], Request],
        *,
        check: Callable[[Request, httpx.Response], str] | None = None,
        connections: int = 1000,
        seed: int = 3,
        timeout_s: float = 30.0,
    ) -> None:
        self.make = make
        self.check = check
        self.rng = random.Random(seed)
        self.inflight = 0
        limits = httpx.Limits(
            max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=2.0
        )
        self.client = httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits)

    def open_connections(self) -> int:
        """Connections in the client's pool now, busy and idle (httpcore's pool)."""
        return len(self.client._transport._pool.connections)  # type: ignore[attr-defined]

    async def one(
        self,
        into: list[Outcome],
        request: Request | None = None,
        *,
        files: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Outcome:
        path, body = request or self.make(self.rng)
        sent = time.monotonic()
        self.inflight += 1
        try:
            timeout = timeout_s or httpx.USE_CLIENT_DEFAULT
            if files:  # a multipart upload: the body's fields as form fields
                resp = await self.client.post(path, data=body, files=files, timeout=timeout)
            else:
                resp = await self.client.post(path, json=body, timeout=timeout)
            outcome = Outcome(path, sent, time.monotonic() - sent, resp.status_code)
            outcome.retry_after = resp.headers.get("retry-after")
            outcome.expired, outcome.at_admission = refusal(resp.status_code, resp.text)
            if resp.status_code == 200 and self.check and (why := self.check((path, body), resp)):
                outcome.status, outcome.error = -1, f"wrong answer: {why}"
            elif resp.status_code != 200:
                outcome.error = resp.text[:80]
        except httpx.HTTPError as exc:
            outcome = Outcome(path, sent, time.monotonic() - sent, 0, error=type(exc).__name__)
        finally:
            self.inflight -= 1
        into.append(outcome)
        return outcome

    async def closed(self, clients: int, seconds: float, into: list[Outcome]) -> float:
        """``clients`` each sending its next request when the last is answered; 200s a second."""
        stop = time.monotonic() + seconds

        async def client() -> None:
            while time.monotonic() < stop:
                await self.one(into)

        await asyncio.gather(*(client() for _ in range(clients)))
        return sum(o.status == 200 for o in into) / seconds

    async def open(self, per_s: float, seconds: float, into: list[Outcome]) -> None:
        """Arrivals at ``per_s`` for ``seconds``, whatever the answers do."""
        tasks: list[asyncio.Task[Outcome]] = []
        started = time.monotonic()
        for i in range(int(per_s * seconds)):
            delay = started + i / per_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self.one(into)))
        await asyncio.gather(*tasks)

    async def __aexit__(self, *_: object) -> None:
        await self.client.aclose()


def quantile(values: list[float], q: float) -> float | None:
    return float(np.quantile(values, q)) if values else None


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def failures(outcomes: list[Outcome]) -> Counter[str]:
    """Every request not answered 200, by path, status and what the server said."""
    return Counter(f"{o.path} {o.status} {o.error}".strip() for o in outcomes if o.status != 200)
