"""Request coalescing on the caller's side of the runner hop, on the same token queue as a runner.

Every call to a runner costs an HTTP round trip and ~2 ms of CPU in each process, which on two
cores is taken straight from the engine. So concurrent requests for the same backend are merged
into one runner call: the first request goes out at once (no added latency when idle); requests
arriving while ``max_inflight`` calls are out wait and leave together in the next call. The runner
then sorts and groups all of them by length.

The waiting requests sit in a ``TokenQueue`` (serving/batching/queue.py), the runner's own queue:
the same admission (429 when full, 503 when it cannot finish in time, both with Retry-After), rounds
under a token budget, rows delivered in order, requests whose caller has gone dropped. The deadline
is end to end: each call tells the runner how much of its requests' budget is left (the tightest
one), so time spent waiting here is not granted a second time there.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from serving.batching import Pending, TokenQueue, deliver, fail
from serving.batching.queue import clock
from serving.protocol import MAX_SEQUENCES


@dataclass(frozen=True)
class Embedded:
    vectors: np.ndarray
    queue_ms: float  # waiting here and in the runner's queue
    inference_ms: float


class EmbeddingClient(Protocol):
    """A runner reached for one backend (services/tokenizer/clients.py)."""

    async def embed(self, ids: list[list[int]], deadline_s: float) -> Embedded:
        """Rows in order; ``deadline_s``: what is left of the tightest request's budget."""
        ...


class Coalescer:
    def __init__(
        self, client: EmbeddingClient, queue: TokenQueue, *, max_inflight: int, max_tokens: int
    ) -> None:
        """``max_inflight`` calls overlap so the runner never idles between them; ``max_tokens``
        caps one call (a single larger request still goes, alone)."""
        self.client = client
        self.queue = queue
        self.max_inflight = max_inflight
        self.max_tokens = max_tokens
        self._inflight = 0
        self._tasks: set[asyncio.Task] = set()

    async def embed(self, ids: list[list[int]]) -> Embedded:
        pending = self.queue.put(ids)  # raises QueueFull / DeadlineExceeded
        self._flush()
        rows = await pending.future
        timing = pending.timing
        return Embedded(rows, timing.queue_s * 1000, timing.inference_s * 1000)

    def _flush(self) -> None:
        while self._inflight < self.max_inflight and self.queue:
            # A runner takes at most MAX_SEQUENCES sequences a call: short texts under a large
            # token budget could come to more.
            batch = self.queue.take(self.max_tokens, MAX_SEQUENCES)
            if not batch:
                return
            self._inflight += 1
            task = asyncio.get_running_loop().create_task(self._call(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _call(self, batch: list[Pending]) -> None:
        tokens = sum(p.tokens for p in batch)
        sent = clock()
        remaining_s = min(p.deadline for p in batch) - sent
        try:
            result = await self.client.embed([s for p in batch for s in p.sequences], remaining_s)
        except Exception as exc:  # shed, unavailable, failed: every merged request gets the error
            self.queue.admission.finished(tokens)
            fail(batch, exc)
        else:
            done = clock()
            self.queue.admission.finished(tokens)
            self.queue.admission.overlapped(tokens, sent, done)  # calls in flight overlap
            for pending in batch:
                pending.timing.queue_s += result.queue_ms / 1000  # plus the runner's queue
                pending.timing.inference_s = result.inference_ms / 1000
            deliver([m for p in batch for m in p.rows_of()], result.vectors)
        finally:
            self._inflight -= 1
            self._flush()
