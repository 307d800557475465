"""Request coalescing on the caller's side of the runner hop.

Every call to a runner costs an HTTP round trip and ~2 ms of CPU in each process, which on two
cores is taken straight from the engine. So concurrent requests for the same backend are merged
into one runner call: the first request goes out at once (no added latency when idle); requests
arriving while ``max_inflight`` calls are out wait and leave together in the next call. The runner
then sorts and groups all of them by length.

The waiting list is a queue like the runner's, so it has the same admission rules: bounded in
tokens (429) and a deadline at the measured speed (503), both with Retry-After. The deadline is
end to end: each call tells the runner how much of its requests' budget is left (the tightest one),
so time spent waiting here is not granted a second time there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from runners.batching.admission import Admission


@dataclass(frozen=True)
class Embedded:
    vectors: np.ndarray
    queue_ms: float  # waiting here and in the runner's queue
    inference_ms: float


# (token ids, seconds left of the tightest deadline among them) -> rows in order
Send = Callable[[list[list[int]], float], Awaitable[Embedded]]


@dataclass
class _Waiting:
    ids: list[list[int]]
    tokens: int
    future: asyncio.Future
    since: float
    deadline: float


class Coalescer:
    def __init__(
        self,
        send: Send,
        *,
        max_inflight: int = 2,
        max_tokens: int = 8192,
        admission: Admission | None = None,
    ) -> None:
        """``max_inflight`` calls overlap so the runner never idles between them; ``max_tokens``
        caps one call (a single larger request still goes, alone)."""
        self.send = send
        self.max_inflight = max_inflight
        self.max_tokens = max_tokens
        self.admission = admission or Admission(max_queue_tokens=131072, deadline_s=10.0)
        self._waiting: list[_Waiting] = []
        self._inflight = 0
        self._last_done = 0.0
        self._tasks: set[asyncio.Task] = set()

    async def embed(self, ids: list[list[int]]) -> Embedded:
        tokens = sum(map(len, ids))
        budget = self.admission.admit(tokens)  # raises QueueFull / DeadlineExceeded
        now = time.perf_counter()
        waiting = _Waiting(
            ids, tokens, asyncio.get_running_loop().create_future(), now, now + budget
        )
        self._waiting.append(waiting)
        self._flush()
        return await waiting.future

    def _flush(self) -> None:
        now = time.perf_counter()
        while self._inflight < self.max_inflight and self._waiting:
            batch: list[_Waiting] = []
            tokens = 0
            while self._waiting and (
                not batch or tokens + self._waiting[0].tokens <= self.max_tokens
            ):
                item = self._waiting.pop(0)
                if item.future.done():  # its caller has gone
                    self.admission.cancelled(item.tokens)
                elif now > item.deadline:
                    item.future.set_exception(self.admission.expired(item.tokens))
                else:
                    self.admission.started(item.tokens)
                    batch.append(item)
                    tokens += item.tokens
            if not batch:
                return
            self._inflight += 1
            task = asyncio.get_running_loop().create_task(self._call(batch, tokens))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _call(self, batch: list[_Waiting], tokens: int) -> None:
        sent = time.perf_counter()
        remaining_s = min(item.deadline for item in batch) - sent
        try:
            result = await self.send([seq for item in batch for seq in item.ids], remaining_s)
        except Exception as exc:  # shed, unavailable, failed: every merged request gets the error
            self.admission.finished(tokens)
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(exc)
        else:
            done = time.perf_counter()
            # Calls overlap: time since the previous answer (or since sending) is what this one cost.
            self.admission.finished(tokens, done - max(sent, self._last_done))
            self._last_done = done
            start = 0
            for item in batch:
                rows = result.vectors[start : start + len(item.ids)]
                start += len(item.ids)
                if not item.future.done():
                    waited_ms = (sent - item.since) * 1000
                    item.future.set_result(
                        Embedded(rows, waited_ms + result.queue_ms, result.inference_ms)
                    )
        finally:
            self._inflight -= 1
            self._flush()
