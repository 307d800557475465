"""Prometheus observations made per request or per engine call, written a moment later in bulk.

``bentoml serve`` runs prometheus_client in multiprocess mode: every ``inc``, ``set`` and each of
the two values a histogram ``observe`` touches is a write to a shared file, taking a lock and
checking the PID (a ``getpid`` system call). On the hot path that was a real share of a request's
CPU; with these tallies the ONNX runner's main thread spends what it did with its batch metrics not
written at all (docs/decisions/0006-metrics-tallies.md). A tally adds up observations in memory;
``Flushes`` writes them once, at most ``FLUSH_S`` after the first one since the last write, on
the event loop that made them, and every pending write is made when the service shuts down
(``flush_all``, called at the ASGI lifespan's shutdown by serving/hot_path.py). A scrape sees a
value up to ``FLUSH_S`` late; the compose stack's Prometheus scrapes every 5 s.

Single-threaded by design: every observation and every flush happens on the service's event loop
thread (the batcher records after its engine call has come back to the loop).

``HistogramTally`` writes what ``Histogram.observe`` would have (the same buckets and count; the
sum, added in another order, to rounding), into prometheus_client 0.26's own fields (the version
is pinned in pyproject.toml): tests/unit/test_batch_metrics.py pins the result to ``observe``'s.
"""

from __future__ import annotations

import asyncio
import logging
import math
import weakref
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

FLUSH_S = 0.25

logger = logging.getLogger(__name__)

_EVERY: weakref.WeakSet[Flushes] = weakref.WeakSet()


def flush_all() -> None:
    """Make every pending write now (the process is about to stop); one that fails is logged,
    and the others are still made."""
    for flushes in list(_EVERY):
        try:
            flushes.now()
        except Exception:
            logger.exception("writing pending metrics at shutdown")


def next_flush(now: float) -> float:
    """The first instant of the flush grid after ``now`` (the loop's clock): within ``FLUSH_S``."""
    return (math.floor(now / FLUSH_S) + 1) * FLUSH_S


class HistogramTally:
    """One histogram series' observations not yet written.

    prometheus_client keeps a series as ``_sum`` and one value per bucket, ``_buckets[i]``
    counting the observations whose first upper bound at or above them is ``_upper_bounds[i]``
    (cumulated at exposition); a flush writes each touched bucket once, and the sum."""

    __slots__ = ("bounds", "counts", "series", "total")

    def __init__(self, series: Any) -> None:
        self.series = series
        self.bounds: list[float] = series._upper_bounds
        self.counts = [0] * len(self.bounds)
        self.total = 0.0

    def add(self, value: float) -> None:
        if value == value:  # not NaN: observe adds a NaN to the sum and to no bucket
            self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def flush(self) -> None:
        counts = self.counts
        for i, count in enumerate(counts):
            if count:
                self.series._buckets[i].inc(count)
                counts[i] = 0
        if self.total:
            self.series._sum.inc(self.total)
            self.total = 0.0


class Flushes:
    """Calls ``write`` at most ``FLUSH_S`` after the first ``soon`` since the last write, on the
    running event loop; at once when no loop is running (a tool, a test).

    The writes fall on one grid, the multiples of ``FLUSH_S`` on the loop's clock (the machine's
    monotonic clock, so every process's loops share it), so every tally of a process is written at
    the same instants: one wake-up of the event loop for all of them, instead of one per tally at
    its own phase. A wake-up is not free: it costs a loop CPU, more with the cores busy, and a
    runner serving chat has three or four tallies armed at any time (its batch metrics, the route's
    request metrics, the arrivals). Saving up to one wake-up a tally each ``FLUSH_S`` is a small
    gain a request, and it costs nothing: the writes' timing is kept
    (docs/decisions/0006-metrics-tallies.md has the figures)."""

    def __init__(self, write: Callable[[], None]) -> None:
        self._write = write
        self._pending: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        _EVERY.add(self)

    def soon(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.now()
            return
        if self._pending is not None:
            if self._loop is loop:
                return
            self.now()  # scheduled on a loop that has gone (a test's, a closed one): write it
        self._loop = loop
        self._pending = loop.call_at(next_flush(loop.time()), self.now)

    def now(self) -> None:
        """Write what is pending (the timer; a batcher's close; shutdown)."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        self._write()
