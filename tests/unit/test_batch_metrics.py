"""The batchers' Prometheus metrics: each Recorder writes to its own labelled series, with each
series looked up at the first observation and kept, not looked up per observation."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client import REGISTRY

from serving.batching.metrics import BATCH_ROWS, Recorder

SERIES = (
    "bundle_batch_rows_count",
    "bundle_batch_rows_sum",
    "bundle_batch_padded_tokens_sum",
    "bundle_padding_efficiency_sum",
    "bundle_engine_seconds_sum",
    "bundle_queue_seconds_count",
)


def values(model: str) -> dict[str, float]:
    labels = {"runner": "unit_runner", "model": model}
    return {name: REGISTRY.get_sample_value(name, labels) or 0.0 for name in SERIES}


def added(before: dict[str, float], model: str) -> dict[str, float]:
    return {name: value - before[name] for name, value in values(model).items()}


def test_each_observation_lands_on_the_recorders_own_series() -> None:
    a, b = Recorder("unit_runner", "a"), Recorder("unit_runner", "b")
    before_a, before_b = values("a"), values("b")
    a.engine_call(rows=4, padded=40, real=30, seconds=0.01)
    a.engine_call(rows=2, padded=20, real=20, seconds=0.03)
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
        }
    )
    assert added(before_b, "b")["bundle_batch_rows_sum"] == 1
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
