"""Request coalescing on the caller's side of the runner hop, on the same token queue as a runner.

Every call to a runner costs an HTTP round trip and CPU in each process, which on two cores is
taken straight from the engine. So concurrent requests for the same backend are merged
into one runner call: the first request goes out at once (no added latency when idle); requests
arriving while calls are out wait and leave together in a later call. The runner then sorts and
groups all of them by length.

A call beyond the first in flight (up to ``max_inflight``) is there so that the runner has work
queued when it finishes the calls before it. It goes out once the runner is expected to be done
with the calls out within ``OVERLAP_SHARE`` of the last one's expected time, at the runner's speed
as this queue measures it, not as soon as a request arrives: sent at once, it carried the few
requests that had arrived since the call before it, and the runner's cost per call was spread
over fewer requests (docs/decisions/0003-coalescing.md has the figures).

The waiting requests sit in a ``TokenQueue`` (serving/batching/queue.py), the runner's own queue:
the same admission (429 when full, 503 when it cannot finish in time, both with Retry-After), rounds
under a token budget, rows delivered in order, requests whose caller has gone dropped. The deadline
is end to end: each call tells the runner how much of its requests' budget is left (the tightest
one), so time spent waiting here is not granted a second time there.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from serving.batching import Pending, TokenQueue, deliver, fail
from serving.batching.queue import clock
from serving.protocol import MAX_SEQUENCES

if TYPE_CHECKING:  # the gate's module imports the clients, which import Embedded from here
    from services.tokenizer.replica_wait import ReplicaWait

# How far from done the calls in flight are expected to be, as a share of the last call's expected
# time, when a call beyond the first goes out. The runner's lanes run out of work some way before a
# call's end (its last engine calls run while a lane has nothing left to take), so the next call
# must be there by then; and the later it goes, the more requests it carries, so the runner and
# the tokenizer spend less CPU a request. Sent later than at once, and later again down to this
# share, it kept the throughput and the lanes did not run dry. (One call in flight saves more CPU
# but loses throughput at few users: tokenizer/settings.py.) The evidence:
# docs/decisions/0003-coalescing.md.
OVERLAP_SHARE = 0.1
# A flush this close to its moment goes at once: uvloop's timers fire on whole milliseconds, up to
# one early, and re-arming for the rest would spin the loop through call_soon until it passed.
TIMER_SLACK_S = 0.001


@dataclass(frozen=True)
class Embedded:
    vectors: np.ndarray
    queue_ms: float  # waiting here and in the runner's queue
    inference_ms: float


class EmbeddingClient(Protocol):
    """A runner reached for one backend (services/tokenizer/clients.py)."""

    async def embed(
        self, ids: list[list[int]], deadline_s: float, segments: list[int] | None = None
    ) -> Embedded:
        """Rows in order; ``deadline_s``: what is left of the tightest request's budget;
        ``segments``: where each pair's second text starts (None: single texts)."""
        ...


class Coalescer:
    def __init__(
        self,
        client: EmbeddingClient,
        queue: TokenQueue,
        *,
        max_inflight: int,
        max_tokens: int,
        replicas: ReplicaWait | None = None,
    ) -> None:
        """``max_inflight``: calls out at once, a call beyond the first sent when those out are
        near their expected end (``OVERLAP_SHARE``), so the runner has work queued when it
        finishes them; ``max_tokens`` caps one call (a single larger request still goes, alone);
        ``replicas``: where requests wait while the runner has no replica up (None: refused)."""
        self.client = client
        self.queue = queue
        self.replicas = replicas
        self.max_inflight = max_inflight
        self.max_tokens = max_tokens
        self._inflight = 0
        self._tasks: set[asyncio.Task] = set()
        self._busy_until = 0.0  # when the runner is expected to be done with the calls out (clock)
        self._last_s = 0.0  # the last call's expected time
        self._timer: asyncio.Handle | None = None  # a flush waiting for its moment
        self._timer_due = 0.0  # and that moment (clock)

    async def embed(self, ids: list[list[int]], segments: list[int] | None = None) -> Embedded:
        """``ids``' rows from the runner, in order (``segments``: for pairs, where each second
        text starts)."""
        if self.replicas is None:
            return await self._embed(ids, segments)
        return await self.replicas.call(lambda: self._embed(ids, segments))

    async def _embed(self, ids: list[list[int]], segments: list[int] | None) -> Embedded:
        pending = self.queue.put(ids, segments=segments)  # raises QueueFull / DeadlineExceeded
        self._flush()
        rows = await pending.future
        timing = pending.timing
        return Embedded(rows, timing.queue_s * 1000, timing.inference_s * 1000)

    def _flush(self) -> None:
        while self._inflight < self.max_inflight and self.queue:
            if self._inflight:  # overlap the calls out: once they are near their end
                due = self._busy_until - OVERLAP_SHARE * self._last_s
                if clock() < due - TIMER_SLACK_S:
                    self._flush_at(due)
                    return
            # A runner takes at most MAX_SEQUENCES sequences a call: short texts under a large
            # token budget could come to more.
            batch = self.queue.take(self.max_tokens, MAX_SEQUENCES)
            if not batch:
                return
            now = clock()
            tokens = sum(p.tokens for p in batch)
            self._last_s = tokens / self.queue.admission.tokens_per_s
            self._busy_until = max(now, self._busy_until) + self._last_s
            self._inflight += 1
            task = asyncio.get_running_loop().create_task(self._call(batch, tokens))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _call(self, batch: list[Pending], tokens: int) -> None:
        sent = clock()
        remaining_s = min(p.deadline for p in batch) - sent
        try:
            rows = [list(s) for p in batch for s in p.sequences]
            if any(p.segments is not None for p in batch):
                segments = [p.segment(row) for p in batch for row in range(len(p.sequences))]
                result = await self.client.embed(rows, remaining_s, segments)
            else:
                result = await self.client.embed(rows, remaining_s)
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
            if not self._inflight:  # the runner is done with them all, whatever was expected
                self._busy_until = clock()
            self._flush()

    def _flush_at(self, due: float) -> None:
        """Flush again at ``due`` (``clock``), unless a flush is due sooner already."""
        if self._timer is not None:
            if self._timer_due <= due:
                return
            self._timer.cancel()
        # A handle, not necessarily a TimerHandle: uvloop runs a delay that rounds to 0 ms as
        # call_soon.
        self._timer = asyncio.get_running_loop().call_later(due - clock(), self._timed_flush)
        self._timer_due = due

    def _timed_flush(self) -> None:
        self._timer = None
        self._flush()
