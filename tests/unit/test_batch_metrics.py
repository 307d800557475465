"""The batchers' Prometheus metrics: each Recorder writes to its own labelled series, with the
series looked up once (at the first observation) rather than per observation."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from serving.batching.metrics import BATCH_ROWS, Recorder


def value(name: str, model: str) -> float:
    return REGISTRY.get_sample_value(name, {"runner": "unit_runner", "model": model}) or 0.0


def test_each_observation_lands_on_the_recorders_own_series() -> None:
    a, b = Recorder("unit_runner", "a"), Recorder("unit_runner", "b")
    a.engine_call(rows=4, padded=40, real=30, seconds=0.01)
    a.engine_call(rows=2, padded=20, real=20, seconds=0.03)
    b.engine_call(rows=1, padded=8, real=8, seconds=0.002)
    a.queued(0.5)
    a.queue_depth(123)
    b.queue_depth(7)
    assert value("bundle_batch_rows_count", "a") == 2
    assert value("bundle_batch_rows_sum", "a") == 6
    assert value("bundle_batch_padded_tokens_sum", "a") == 60
    assert value("bundle_padding_efficiency_sum", "a") == pytest.approx(0.75 + 1.0)
    assert value("bundle_engine_seconds_sum", "a") == pytest.approx(0.04)
    assert value("bundle_queue_seconds_count", "a") == 1
    assert value("bundle_queued_tokens", "a") == 123
    assert value("bundle_batch_rows_sum", "b") == 1
    assert value("bundle_queued_tokens", "b") == 7


def test_the_labelled_series_is_looked_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    looked_up = []
    labels = BATCH_ROWS.labels

    def counted(*args: object, **kwargs: object) -> object:
        looked_up.append(kwargs)
        return labels(*args, **kwargs)

    monkeypatch.setattr(BATCH_ROWS, "labels", counted)
    recorder = Recorder("unit_runner", "once")
    for _ in range(5):
        recorder.engine_call(rows=3, padded=30, real=27, seconds=0.01)
    assert looked_up == [{"runner": "unit_runner", "model": "once"}]
    assert value("bundle_batch_rows_count", "once") == 5
