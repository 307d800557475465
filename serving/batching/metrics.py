"""Prometheus metrics of the token queues and batchers, exported on each service's /metrics.

``bentoml.metrics`` (not bare prometheus_client) so that values from every worker process are
aggregated by BentoML's multiprocess collector.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import bentoml

from serving.tallies import Flushes, HistogramTally

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
# The engine's CPU, for the benchmark's split of a runner's CPU into engine and everything else
# (loadtests/points.py): process CPU from /proc minus this is what the runner spends around the
# engine. Measured on the lane's thread (batcher.py, ``_compute``); for a solo call, which holds
# every lane, every thread's CPU but the event loop's, so its session's threads are in it. Other
# engines' own threads (TensorFlow's, a one-lane ONNX session's) are not, and count as the
# runner's. Written at each call, not tallied with the histograms: the benchmark reads it
# together with /proc at the load's end, and a tally would still hold the last 0.25 s of calls
# (one write a call, several requests a call).
ENGINE_CPU_SECONDS = bentoml.metrics.Counter(
    name="bundle_engine_cpu_seconds",
    documentation="CPU seconds inside engine calls: the lane's thread (a solo call: every thread but the event loop's)",
    labelnames=_LABELS,
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

    def engine_call(
        self, rows: int, padded: int, real: int, seconds: float, cpu_seconds: float = 0.0
    ) -> None: ...
    def queued(self, seconds: float) -> None: ...
    def shed(self, reason: str) -> None: ...
    def queue_depth(self, tokens: int) -> None: ...
    def flush(self) -> None: ...


class Recorder(NullRecorder):
    """Writes one batcher's observations to the metrics above, under fixed labels.

    Each metric's child for those labels is looked up at its first observation and kept:
    ``labels()`` formats the values and takes a lock on every call (to return the same child
    each time). Observations are tallied and written together a moment later (serving/tallies.py:
    a runner observes four histograms an engine call and one a request); the engine's CPU is
    written as each call ends (``ENGINE_CPU_SECONDS``)."""

    _TALLIES = ("_rows", "_padded", "_efficiency", "_engine", "_queue")

    def __init__(self, runner: str, model: str) -> None:
        self.labels = {"runner": runner, "model": model}
        self._depth_now: int | None = None
        self._flushes = Flushes(self._write)

    @cached_property
    def _rows(self) -> HistogramTally:
        return HistogramTally(BATCH_ROWS.labels(**self.labels))

    @cached_property
    def _padded(self) -> HistogramTally:
        return HistogramTally(BATCH_PADDED_TOKENS.labels(**self.labels))

    @cached_property
    def _efficiency(self) -> HistogramTally:
        return HistogramTally(PADDING_EFFICIENCY.labels(**self.labels))

    @cached_property
    def _engine(self) -> HistogramTally:
        return HistogramTally(ENGINE_SECONDS.labels(**self.labels))

    @cached_property
    def _queue(self) -> HistogramTally:
        return HistogramTally(QUEUE_SECONDS.labels(**self.labels))

    @cached_property
    def _depth(self) -> Any:
        return QUEUED_TOKENS.labels(**self.labels)

    @cached_property
    def _engine_cpu_series(self) -> Any:
        return ENGINE_CPU_SECONDS.labels(**self.labels)

    def engine_call(
        self, rows: int, padded: int, real: int, seconds: float, cpu_seconds: float = 0.0
    ) -> None:
        if cpu_seconds > 0:  # a counter refuses a negative increment
            self._engine_cpu_series.inc(cpu_seconds)
        self._rows.add(rows)
        self._padded.add(padded)
        self._efficiency.add(real / padded)
        self._engine.add(seconds)
        self._flushes.soon()

    def queued(self, seconds: float) -> None:
        self._queue.add(seconds)
        self._flushes.soon()

    def shed(self, reason: str) -> None:
        SHED.labels(**self.labels, reason=reason).inc()  # rare, and one child per reason

    def queue_depth(self, tokens: int) -> None:
        self._depth_now = tokens
        self._flushes.soon()

    def flush(self) -> None:
        """Write what was observed and not yet written."""
        self._flushes.now()

    def _write(self) -> None:
        for name in self._TALLIES:
            tally = self.__dict__.get(name)  # a tally never observed has nothing to write
            if tally is not None:
                tally.flush()
        if self._depth_now is not None:
            self._depth.set(self._depth_now)
            self._depth_now = None
