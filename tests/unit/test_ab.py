"""make ab's arithmetic: medians over rounds per figure, and head/base ratios of those medians."""

from __future__ import annotations

import math

import pytest

from loadtests import ab
from loadtests.ab import Sample, sample, summary
from loadtests.points import Point


def test_summary_is_medians_and_their_ratio() -> None:
    base = [
        Sample(100, 4.0, 0.9, 0.6, 0.9, 5.0, 0),
        Sample(120, 5.0, 1.0, 0.7, 1.0, 5.2, 0),
        Sample(90, 4.5, 1.1, 0.8, 1.1, 5.1, 3),
    ]
    head = [
        Sample(130, 3.5, 0.8, 0.6, 0.8, 5.0, 0),
        Sample(110, 3.9, 0.7, 0.5, 0.6, 5.1, 2),
        Sample(125, 3.8, 0.9, 0.7, 0.9, 4.9, 4),
    ]
    rows = {name: (b, h, ratio) for name, b, h, ratio in summary(base, head)}
    assert list(rows) == [
        "sentences_per_s",
        "p50_ms",
        "tokenizer_ms",
        "runner_main_ms",
        "runner_serving_ms",
        "engine_ms",
        "not_ok",
    ]
    assert rows["sentences_per_s"] == (100, 125, 1.25)
    assert rows["p50_ms"] == (4.5, 3.8, pytest.approx(3.8 / 4.5))
    assert rows["tokenizer_ms"] == (1.0, 0.8, pytest.approx(0.8))
    assert rows["runner_serving_ms"] == (1.0, 0.8, pytest.approx(0.8))
    assert rows["not_ok"][:2] == (3, 6)  # summed: a round that shed is not hidden by a median


def _point(failures: int = 0, shed: int = 0) -> Point:
    return Point(
        "stack", "chat", 64, 0, sentences_per_s=480.0, requests_per_s=480.0, p50_ms=120.5,
        p99_ms=180.0, requests=4800, failures=failures, shed=shed, loadgen_cpu_share=0.01,
        cpu_ms_per_request={
            "tokenizer": {"main_ms": 0.28, "other_threads_ms": 0.01, "total_ms": 0.29},
            "onnx_runner": {"main_ms": 0.10, "other_threads_ms": 3.3, "total_ms": 3.4,
                            "engine_ms": 3.25, "serving_ms": 0.15},
        },
    )  # fmt: skip


def test_a_sample_is_read_from_make_bench_s_point() -> None:
    assert sample(_point()) == Sample(480.0, 120.5, 0.29, 0.10, 0.15, 3.25, 0)


def test_a_runner_that_does_not_split_its_cpu_gives_no_engine_figure() -> None:
    # A base tree from before the runners counted their engine's CPU: not a figure of 0.
    point = _point()
    for key in ("engine_ms", "serving_ms"):
        del point.cpu_ms_per_request["onnx_runner"][key]
    s = sample(point)
    assert math.isnan(s.runner_serving_ms) and math.isnan(s.engine_ms)


def test_failed_and_shed_requests_are_counted_not_dropped() -> None:
    # A change that sheds load is a result to compare, so the point is kept with its count.
    assert sample(_point(failures=1, shed=2)).not_ok == 3


class _Server:
    def __init__(self, url: str) -> None:
        self.url = url

    def tail(self) -> str:
        return f"log of {self.url}"


def test_a_server_that_does_not_drain_stops_the_comparison(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    def drain(url: str) -> bool:
        asked.append(url)
        return url != "http://head"

    monkeypatch.setattr(ab.points, "drain", drain)
    servers = {"base": _Server("http://base"), "head": _Server("http://head")}
    with pytest.raises(RuntimeError, match="head did not work off its queue"):
        ab.drained(servers)  # type: ignore[arg-type]
    assert asked == ["http://base", "http://head"]
    monkeypatch.setattr(ab.points, "drain", lambda url: True)
    ab.drained(servers)  # type: ignore[arg-type]
