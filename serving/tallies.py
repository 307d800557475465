"""Prometheus observations made per request or per engine call, written a moment later in bulk.

``bentoml serve`` runs prometheus_client in multiprocess mode: every ``inc``, ``set`` and each of
the two values a histogram ``observe`` touches is a write to a shared file, taking a lock and
checking the PID (a ``getpid`` system call). On the hot path that was a real share of a request's
CPU: the ONNX runner's batch metrics alone ~9 % of its main thread at 64 users (make ab, 0.129 ->
0.117 ms a chat request). A tally adds up observations in memory; ``Flushes`` writes them once,
``FLUSH_S`` after the first one since the last write, on the event loop that made them (at once
where no loop runs). A scrape sees a value at most that much later; Prometheus scrapes every
15 s or so.

``HistogramTally`` writes what ``Histogram.observe`` would have (the same buckets, count and sum),
into prometheus_client 0.26's own fields (the version is pinned in pyproject.toml):
tests/unit/test_batch_metrics.py pins the result to ``observe``'s.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

FLUSH_S = 0.25


class HistogramTally:
    """One histogram series' observations not yet written.

    prometheus_client keeps a series as ``_sum`` and one value per bucket, ``_buckets[i]``
    counting the observations whose first upper bound at or above them is ``_upper_bounds[i]``
    (cumulated at exposition); a flush writes each touched bucket once."""

    __slots__ = ("bounds", "counts", "series", "total")

    def __init__(self, series: Any) -> None:
        self.series = series
        self.bounds: list[float] = series._upper_bounds
        self.counts = [0] * len(self.bounds)
        self.total = 0.0

    def add(self, value: float) -> None:
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
    """Calls ``write`` ``FLUSH_S`` after the first ``soon`` since the last write; at once when
    no event loop is running (a tool, a test)."""

    def __init__(self, write: Callable[[], None]) -> None:
        self._write = write
        self._pending: asyncio.TimerHandle | None = None

    def soon(self) -> None:
        if self._pending is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write()
            return
        self._pending = loop.call_later(FLUSH_S, self.now)

    def now(self) -> None:
        """Write what is pending (a batcher's close; the timer)."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        self._write()
