"""The bounded version of `make cold-start`: one start of the whole graph, from launch to ready and
to its first correct answer (loadtests/cold_start.py raises if the first answer is not the warm
one), each service's start logged in parts. No assertion is a speed: how long each part took is
printed, and `make cold-start` records the medians of five starts."""

from __future__ import annotations

import json

import pytest

from loadtests import cold_start

SERVICES = {"tokenizer", "onnx_runner", "tf_runner", "tenant_runner"}


@pytest.fixture(scope="module")
def result() -> dict:
    found = cold_start.run(starts=1, steady=10, idle=1)
    print(json.dumps(found, indent=1))
    print(cold_start.render(found))
    return found


def test_every_service_logs_its_start_in_parts(result: dict) -> None:
    services = result["starts"][0]["services"]
    assert set(services) == SERVICES
    for name, s in services.items():
        assert s["import_s"] > 0 and s["load_s"] >= 0 and s["warm_up_s"] > 0, (name, s)
        parts = s["import_s"] + s["load_s"] + s["warm_up_s"]
        assert parts <= s["total_s"] + 0.01, (name, s)
        assert s["started_s"] + s["total_s"] == pytest.approx(s["ready_s"], abs=0.01), (name, s)
    assert set(result["median"]["services"]) == SERVICES


def test_the_graph_is_ready_only_once_every_service_has_warmed_up(result: dict) -> None:
    """Each service logs its record when its warm-up ends (the tokenizer's: a request through each
    runner); /readyz answered 200 only after the last of them."""
    start = result["starts"][0]
    last = max(s["ready_s"] for s in start["services"].values())
    assert last <= start["ready_s"] + 0.01, start
    assert start["ready_s"] <= start["first_answer_s"]


def test_the_first_answer_and_the_steady_ones_are_measured(result: dict) -> None:
    start = result["starts"][0]
    assert start["first_ms"] > 0 and start["steady_p50_ms"] > 0
    assert start["first_over_steady"] == pytest.approx(
        start["first_ms"] / start["steady_p50_ms"], rel=0.05
    )
    assert "| tokenizer |" in cold_start.render(result)
