"""Prometheus metrics of the token queues and batchers, exported on each service's /metrics.

``bentoml.metrics`` (not bare prometheus_client) so that values from every worker process are
aggregated by BentoML's multiprocess collector.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from functools import cached_property
from typing import Any

import bentoml

_LABELS = ["runner", "model"]

BATCH_ROWS = bentoml.metrics.Histogram(
    name="bundle_batch_rows",
    documentation="Sequences per engine call",
    labelnames=_LABELS,
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
BATCH_PADDED_TOKENS = bentoml.metrics.Histogram(
    name="bundle_batch_padded_tokens",
    documentation="Padded tokens (rows x longest row) per engine call",
    labelnames=_LABELS,
    buckets=(16, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
)
PADDING_EFFICIENCY = bentoml.metrics.Histogram(
    name="bundle_padding_efficiency",
    documentation="Real tokens / padded tokens per engine call (1 = no padding)",
    labelnames=_LABELS,
    buckets=(0.25, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 1.0),
)
QUEUE_SECONDS = bentoml.metrics.Histogram(
    name="bundle_queue_seconds",
    documentation="Time a request waited before its batch round started",
    labelnames=_LABELS,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
ENGINE_SECONDS = bentoml.metrics.Histogram(
    name="bundle_engine_seconds",
    documentation="Engine time per call",
    labelnames=_LABELS,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
SHED = bentoml.metrics.Counter(
    name="bundle_shed_requests",
    documentation="Requests refused instead of queued (reason: queue_full, deadline)",
    labelnames=[*_LABELS, "reason"],
)
QUEUED_TOKENS = bentoml.metrics.Gauge(
    name="bundle_queued_tokens",
    documentation="Tokens waiting in the queue",
    labelnames=_LABELS,
    multiprocess_mode="livesum",
)


class NullRecorder:
    """Observes nothing: what a queue records to when no metrics are wanted (tests, tools)."""

    def engine_call(self, rows: int, padded: int, real: int, seconds: float) -> None: ...
    def queued(self, seconds: float) -> None: ...
    def shed(self, reason: str) -> None: ...
    def queue_depth(self, tokens: int) -> None: ...
    def flush(self) -> None: ...


# How long observations made on an event loop wait before they are written (a scrape sees them
# that much later at most; Prometheus scrapes every 15 s or so).
FLUSH_S = 0.25


class _Tally:
    """One histogram series' observations not yet written: ``Histogram.observe`` in bulk.

    prometheus_client 0.26 (pinned) keeps a series as ``_sum`` and one value per bucket,
    ``_buckets[i]`` counting the observations whose first upper bound at or above them is
    ``_upper_bounds[i]`` (cumulated at exposition). Each ``observe`` writes two of them to the
    multiprocess files, each write taking a lock and checking the PID (a ``getpid`` call); a
    runner observed five histograms per engine call that way, ~9 % of its main thread's CPU at 64
    users (make ab, NullRecorder against Recorder). A tally adds in memory and writes each touched
    bucket once per flush. tests/unit/test_batch_metrics.py pins the result to ``observe``'s."""

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


class Recorder(NullRecorder):
    """Writes one batcher's observations to the metrics above, under fixed labels.

    Each metric's child for those labels is looked up at its first observation and kept:
    ``labels()`` formats the values and takes a lock on every call (to return the same child
    each time). Observations made on an event loop are tallied and written together ``FLUSH_S``
    later (``_Tally``); made elsewhere (a tool, a test), at once."""

    _TALLIES = ("_rows", "_padded", "_efficiency", "_engine", "_queue")

    def __init__(self, runner: str, model: str) -> None:
        self.labels = {"runner": runner, "model": model}
        self._depth_now: int | None = None
        self._flush_at: asyncio.TimerHandle | None = None

    @cached_property
    def _rows(self) -> _Tally:
        return _Tally(BATCH_ROWS.labels(**self.labels))

    @cached_property
    def _padded(self) -> _Tally:
        return _Tally(BATCH_PADDED_TOKENS.labels(**self.labels))

    @cached_property
    def _efficiency(self) -> _Tally:
        return _Tally(PADDING_EFFICIENCY.labels(**self.labels))

    @cached_property
    def _engine(self) -> _Tally:
        return _Tally(ENGINE_SECONDS.labels(**self.labels))

    @cached_property
    def _queue(self) -> _Tally:
        return _Tally(QUEUE_SECONDS.labels(**self.labels))

    @cached_property
    def _depth(self) -> Any:
        return QUEUED_TOKENS.labels(**self.labels)

    def engine_call(self, rows: int, padded: int, real: int, seconds: float) -> None:
        self._rows.add(rows)
        self._padded.add(padded)
        self._efficiency.add(real / padded)
        self._engine.add(seconds)
        self._written_soon()

    def queued(self, seconds: float) -> None:
        self._queue.add(seconds)
        self._written_soon()

    def shed(self, reason: str) -> None:
        SHED.labels(**self.labels, reason=reason).inc()  # rare, and one child per reason

    def queue_depth(self, tokens: int) -> None:
        self._depth_now = tokens
        self._written_soon()

    def flush(self) -> None:
        """Write what was observed and not yet written."""
        self._flush_at = None
        for name in self._TALLIES:
            tally = self.__dict__.get(name)  # a tally never observed has nothing to write
            if tally is not None:
                tally.flush()
        if self._depth_now is not None:
            self._depth.set(self._depth_now)
            self._depth_now = None

    def _written_soon(self) -> None:
        if self._flush_at is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop to flush later on
            self.flush()
            return
        self._flush_at = loop.call_later(FLUSH_S, self.flush)
