"""The batchers' Prometheus metrics: each Recorder writes to its own labelled series, with each
series looked up at the first observation and kept, not looked up per observation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from prometheus_client import REGISTRY

from serving.batching.metrics import BATCH_ROWS, ENGINE_SECONDS, Recorder

SERIES = (
    "bundle_batch_rows_count",
    "bundle_batch_rows_sum",
    "bundle_batch_padded_tokens_sum",
    "bundle_padding_efficiency_sum",
    "bundle_engine_seconds_sum",
    "bundle_queue_seconds_count",
    "bundle_engine_cpu_seconds_total",
)


def values(model: str) -> dict[str, float]:
    labels = {"runner": "unit_runner", "model": model}
    return {name: REGISTRY.get_sample_value(name, labels) or 0.0 for name in SERIES}


def added(before: dict[str, float], model: str) -> dict[str, float]:
    return {name: value - before[name] for name, value in values(model).items()}


def test_each_observation_lands_on_the_recorders_own_series() -> None:
    a, b = Recorder("unit_runner", "a"), Recorder("unit_runner", "b")
    before_a, before_b = values("a"), values("b")
    a.engine_call(rows=4, padded=40, real=30, seconds=0.01, cpu_seconds=0.008)
    a.engine_call(rows=2, padded=20, real=20, seconds=0.03, cpu_seconds=0.025)
    b.engine_call(rows=1, padded=8, real=8, seconds=0.002)
    a.queued(0.5)
    a.queue_depth(123)
    b.queue_depth(7)
    assert added(before_a, "a") == pytest.approx(
        {
            "bundle_batch_rows_count": 2,
            "bundle_batch_rows_sum": 6,
            "bundle_batch_padded_tokens_sum": 60,
            "bundle_padding_efficiency_sum": 0.75 + 1.0,
            "bundle_engine_seconds_sum": 0.04,
            "bundle_queue_seconds_count": 1,
            "bundle_engine_cpu_seconds_total": 0.033,
        }
    )
    assert added(before_b, "b")["bundle_batch_rows_sum"] == 1
    assert added(before_b, "b")["bundle_engine_cpu_seconds_total"] == 0
    # A reading below zero (a clock's lag) is not written: a counter would raise on it.
    b.engine_call(rows=1, padded=8, real=8, seconds=0.002, cpu_seconds=-1e-4)
    assert added(before_b, "b")["bundle_engine_cpu_seconds_total"] == 0
    assert added(before_b, "b")["bundle_batch_rows_sum"] == 2
    depth = {"runner": "unit_runner"}
    assert REGISTRY.get_sample_value("bundle_queued_tokens", {**depth, "model": "a"}) == 123
    assert REGISTRY.get_sample_value("bundle_queued_tokens", {**depth, "model": "b"}) == 7


def test_the_labelled_series_is_looked_up_at_the_first_observation_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looked_up: list[dict[str, object]] = []
    labels: Callable[..., object] = BATCH_ROWS.labels

    def counted(*args: object, **kwargs: object) -> object:
        looked_up.append(kwargs)
        return labels(*args, **kwargs)

    monkeypatch.setattr(BATCH_ROWS, "labels", counted)
    recorder = Recorder("unit_runner", "once")
    assert looked_up == []  # not at construction
    before = values("once")
    for _ in range(5):
        recorder.engine_call(rows=3, padded=30, real=27, seconds=0.01)
    assert looked_up == [{"runner": "unit_runner", "model": "once"}]
    assert added(before, "once")["bundle_batch_rows_count"] == 5


def samples(series) -> dict[tuple[str, str], float]:
    """A histogram series' samples but ``_created``, by name and bucket bound."""
    return {
        (s.name, s.labels.get("le", "")): s.value for s in series._samples() if s.name != "_created"
    }


def observed(histogram, values_: list[float]) -> dict[tuple[str, str], float]:
    """What a fresh series of ``histogram``'s kind shows after ``observe`` of each value."""
    from prometheus_client import CollectorRegistry, Histogram

    reference = Histogram(
        "reference", "d", ["k"], buckets=histogram._kwargs["buckets"], registry=CollectorRegistry()
    ).labels(k="v")
    for value in values_:
        reference.observe(value)
    return samples(reference)


def test_on_an_event_loop_observations_are_written_together_as_observe_would_write_them() -> None:
    """The tally writes what ``Histogram.observe`` would: the same buckets (values on a bound
    included), count and sum; and only once ``FLUSH_S`` has passed, not per observation."""
    from serving.tallies import FLUSH_S

    recorder = Recorder("unit_runner", "tallied")
    rows = [1, 2, 3, 4, 5, 64, 100, 300, 4, 4]  # on bounds, between, beyond the last
    seconds = [0.0005, 0.0007, 0.01, 3.0, 0.0001, 0.25, 0.25, 0.02, 0.5, -1.0]  # on bounds, below
    series = {
        h: h.labels(runner="unit_runner", model="tallied") for h in (BATCH_ROWS, ENGINE_SECONDS)
    }
    before = {h: samples(s) for h, s in series.items()}

    async def observe_then_wait() -> tuple[dict, dict]:
        for r, s in zip(rows, seconds, strict=True):
            recorder.engine_call(rows=r, padded=10 * r, real=9 * r, seconds=s)
        unwritten = {h: samples(s) for h, s in series.items()}
        await asyncio.sleep(FLUSH_S + 0.2)
        return unwritten, {h: samples(s) for h, s in series.items()}

    unwritten, written = asyncio.run(observe_then_wait())
    assert unwritten == before
    for histogram, values_ in ((BATCH_ROWS, rows), (ENGINE_SECONDS, seconds)):
        delta = {k: v - before[histogram][k] for k, v in written[histogram].items()}
        expected = observed(histogram, values_)
        assert delta.keys() == expected.keys()
        assert delta == pytest.approx(expected)


def _recorder_flush(recorder: Recorder) -> None:
    recorder.flush()  # as a batcher's close does


def _flush_all(recorder: Recorder) -> None:
    from serving.tallies import flush_all

    flush_all()  # as the lean path does at the lifespan's shutdown


@pytest.mark.parametrize("flush", [_recorder_flush, _flush_all])
def test_a_flush_writes_what_is_pending_and_the_latest_queue_depth(flush) -> None:
    """Nothing observed is lost when a batcher closes or the process stops."""
    model = f"flushed{flush.__name__}"
    recorder = Recorder("unit_runner", model)
    before = values(model)

    async def observe_then_flush() -> dict[str, float]:
        recorder.engine_call(rows=3, padded=30, real=27, seconds=0.01)
        recorder.queued(0.2)
        recorder.queue_depth(50)
        recorder.queue_depth(20)
        pending = added(before, model)
        flush(recorder)
        return pending

    assert set(asyncio.run(observe_then_flush()).values()) == {0}
    written = added(before, model)
    assert (written["bundle_batch_rows_sum"], written["bundle_queue_seconds_count"]) == (3, 1)
    depth = REGISTRY.get_sample_value(
        "bundle_queued_tokens", {"runner": "unit_runner", "model": model}
    )
    assert depth == 20


def test_a_nan_counts_in_the_sum_and_no_bucket_as_observe_does() -> None:
    from serving.tallies import HistogramTally

    series = ENGINE_SECONDS.labels(runner="unit_runner", model="nan")
    before = samples(series)
    tally = HistogramTally(series)
    for value in (0.001, float("nan"), 0.3):
        tally.add(value)
    tally.flush()
    after = samples(series)
    expected = observed(ENGINE_SECONDS, [0.001, float("nan"), 0.3])
    buckets = {k: after[k] - before[k] for k in after if k[0] == "_bucket"}
    assert buckets == {k: v for k, v in expected.items() if k[0] == "_bucket"}
    assert after[("_sum", "")] != after[("_sum", "")]  # NaN, as observe leaves it


def test_a_write_pending_on_a_loop_that_has_gone_is_made_by_the_next_observation() -> None:
    """A flush scheduled on an event loop that closed before it fired (a test's, a TestClient's)
    is written by the next observation, on another loop or none, not left pending for ever."""
    recorder = Recorder("unit_runner", "gone")
    before = values("gone")

    async def observe() -> None:
        recorder.engine_call(rows=2, padded=20, real=20, seconds=0.01)

    asyncio.run(observe())  # closes its loop with the flush still scheduled
    assert added(before, "gone")["bundle_batch_rows_sum"] == 0
    recorder.engine_call(rows=3, padded=30, real=30, seconds=0.01)  # no loop: written at once
    assert added(before, "gone")["bundle_batch_rows_sum"] == 5
    asyncio.run(observe())
    assert added(before, "gone")["bundle_batch_rows_sum"] == 5
    asyncio.run(observe())  # finds the last loop's write pending: makes it, with its own
    assert added(before, "gone")["bundle_batch_rows_sum"] == 9


@pytest.mark.parametrize("ending", ["lifespan.shutdown.complete", "lifespan.shutdown.failed"])
def test_the_lean_path_makes_the_pending_writes_when_the_lifespan_shuts_down(ending: str) -> None:
    """Through ``HotPath`` as uvicorn calls it: the app's lifespan, and its end (complete, or
    failed when a shutdown hook raised), write what the last requests observed."""
    import gc

    from serving.hot_path import HotPath

    model = ending.rsplit(".", 1)[1]
    recorder = Recorder("unit_runner", model)
    before = values(model)
    sent: list[str] = []
    seen: list[float] = []

    async def app(scope: dict, receive, send) -> None:  # BentoML's app, for the lifespan
        assert scope["type"] == "lifespan"
        await send({"type": "lifespan.startup.complete"})
        recorder.engine_call(rows=6, padded=60, real=60, seconds=0.01)  # a request meanwhile
        seen.append(added(before, model)["bundle_batch_rows_sum"])
        await send({"type": ending})

    async def send(message: dict) -> None:
        sent.append(message["type"])

    lean = HotPath.__new__(HotPath)  # only what a lifespan scope reaches
    lean.app = app
    threshold = gc.get_threshold()
    try:
        asyncio.run(lean({"type": "lifespan"}, None, send))
    finally:  # HotPath tunes the collector at start-up: not for this test process
        gc.unfreeze()
        gc.set_threshold(*threshold)
    assert seen == [0]
    assert added(before, model)["bundle_batch_rows_sum"] == 6
    assert sent == ["lifespan.startup.complete", ending]
