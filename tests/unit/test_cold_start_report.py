"""What `make cold-start` compares and prints, without starting anything: an image's first answer
is its warm one, timings aside (loadtests/cold_start.same), and the record renders a row per
image where it has them (loadtests/cold_start.render)."""

from __future__ import annotations

import json

import pytest

from loadtests import cold_start
from loadtests.cold_start import MAX_ABS_DIFF, same
from testkit.processes import ROOT


def test_an_answer_is_the_warm_one_when_only_its_timings_differ() -> None:
    warm = {"embeddings": [[0.25, -0.5]], "queue_ms": 1.0, "model": "m", "tokens": [3]}
    assert same({**warm, "queue_ms": 9.0, "inference_ms": 4.0}, warm)
    assert same({**warm, "embeddings": [[0.25 + MAX_ABS_DIFF / 2, -0.5]]}, warm)
    assert not same({**warm, "embeddings": [[0.25 + 2 * MAX_ABS_DIFF, -0.5]]}, warm)
    assert not same({**warm, "embeddings": [[0.25]]}, warm)  # a row cut short
    assert not same({**warm, "model": "other"}, warm)
    assert not same({**warm, "tokens": [4]}, warm)
    assert same([], []) and not same(["a"], [])  # a tenant runner's listing
    # a field missing or of another type on one side: not the same answer, and no exception
    assert not same({**warm, "embeddings": [[None, -0.5]]}, warm)
    assert not same({"score": "0.5"}, {"score": 0.5}) and not same({"n": True}, {"n": 1})


def test_a_record_with_images_renders_a_row_per_image() -> None:
    recorded = sorted((ROOT / "loadtests" / "results" / "cold-start").glob("*.json"))[-1]
    result = json.loads(recorded.read_text())
    image = {"container_started_s": 0.5, "worker_started_s": 1.5, "import_s": 3.0,
             "load_s": 1.0, "warm_up_s": 2.0, "ready_s": 8.0, "first_answer_s": 8.1,
             "first_ms": 12.0, "steady_p50_ms": 10.0, "first_over_steady": 1.2}  # fmt: skip
    result["images"] = {"onnx-runner": {"starts": [image], "median": image}}
    text = cold_start.render(result)
    assert "| image (from its launch, s) | container started |" in text
    assert "| onnx-runner | 0.5 | 1.5 | 3.0 | 1.0 | 2.0 | 8.0 | 8.1 | 12.0 | 10.0 | 1.2 |" in text
    result["images"] = {}
    assert "| image" not in cold_start.render(result)  # a record of the graph alone


def test_the_images_are_added_to_the_graph_s_last_record_of_the_same_commit(
    tmp_path, monkeypatch
) -> None:
    """`--images` adds to the record the graph's last `--record` run named (not one found by
    today's date, which a run past midnight would miss), and refuses one of another commit."""
    last = tmp_path / "graph-record"
    monkeypatch.setattr(cold_start, "LAST", last)
    with pytest.raises(SystemExit, match="no recorded run of the graph"):
        cold_start.graph_record("abc1234")
    recorded = tmp_path / "2026-11-29.json"
    recorded.write_text(json.dumps({"meta": {"commit": "abc1234"}}))
    last.write_text(f"{recorded}\n")
    assert cold_start.graph_record("abc1234+changes") == recorded  # the record itself changes it
    with pytest.raises(SystemExit, match="measured on abc1234, this tree is def5678"):
        cold_start.graph_record("def5678")
