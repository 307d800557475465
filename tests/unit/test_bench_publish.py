"""What ``make bench`` does with a finished run (``bench.publish``): a run within its raw limits is
recorded (loadtests/results/DATE.json, and loadtests/results/results.md regenerated from it) and
exits 0; a run with a served figure above its backend's raw limit records nothing and exits 1 (a
quick run: only beyond its slack, and it warns within it).
The run is the newest recorded one, published into a scratch copy of the tree's paths."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from loadtests import bench, report
from loadtests.points import STACK
from testkit.processes import ROOT

RECORDED = sorted((ROOT / "loadtests" / "results").glob("*.json"))


@pytest.fixture
def run() -> dict:
    assert RECORDED, "no benchmark run is recorded in loadtests/results to publish again"
    return json.loads(RECORDED[-1].read_text())


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """build/bench and loadtests/results, in ``tmp_path``."""
    out, results = tmp_path / "build" / "bench", tmp_path / "loadtests" / "results"
    out.mkdir(parents=True)
    monkeypatch.setattr(bench, "OUT", out)
    monkeypatch.setattr(bench, "RESULTS", results)
    monkeypatch.setattr(report, "RESULTS_MD", results / "results.md")
    monkeypatch.setattr(report, "ROOT", tmp_path)  # results.md names the record from the root
    return {"out": out, "results": results}


def test_a_run_within_its_limits_is_recorded_and_exits_0(run, scratch, capsys) -> None:
    assert bench.publish(run, record=True) == 0
    recorded = scratch["results"] / f"{run['meta']['date'][:10]}.json"
    assert json.loads(recorded.read_text()) == run
    assert json.loads((scratch["out"] / "results.json").read_text()) == run
    written = (scratch["results"] / "results.md").read_text()
    assert written == report.results_md(recorded)
    assert f"commit {run['meta']['commit']}" in written and report.markdown(run) in written
    said = capsys.readouterr()
    assert "error:" not in said.err and str(recorded) in said.out


def test_a_run_not_to_record_writes_only_build_bench(run, scratch) -> None:
    assert bench.publish(run, record=False) == 0
    assert json.loads((scratch["out"] / "results.json").read_text()) == run
    assert (scratch["out"] / "results.md").read_text().strip() == report.markdown(run).strip()
    assert not scratch["results"].exists()


def test_a_served_figure_above_raw_records_nothing_and_exits_1(run, scratch, capsys) -> None:
    wrong = copy.deepcopy(run)
    chat = next(
        r
        for r in wrong["rows"]
        if (r["system"], r["workload"], r["users"]) == (STACK, "chat", wrong["meta"]["middle"])
    )
    chat["sentences_per_s"] = wrong["raw"]["fp32"]["sentences_per_s"] + 1
    assert bench.publish(wrong, record=True) == 1
    assert not scratch["results"].exists()
    # Kept in build/bench for a look at what went wrong.
    assert json.loads((scratch["out"] / "results.json").read_text()) == wrong
    err = capsys.readouterr().err
    assert "served above its raw limit" in err and f"{STACK} chat {chat['users']}" in err


def test_a_quick_run_within_its_slack_above_raw_warns_and_exits_0(run, scratch, capsys) -> None:
    quick = copy.deepcopy(run)
    quick["meta"]["quick"] = True
    bulk = next(
        r
        for r in quick["rows"]
        if (r["system"], r["workload"], r["users"]) == (STACK, "bulk", quick["meta"]["middle"])
    )
    bulk["sentences_per_s"] = quick["raw"]["fp32"]["sentences_per_s"] * (1 + report.QUICK_SLACK / 2)
    assert bench.publish(quick, record=False) == 0
    err = capsys.readouterr().err
    assert "error:" not in err
    assert "warning: served above its raw limit" in err and f"{STACK} bulk {bulk['users']}" in err
    bulk["sentences_per_s"] = quick["raw"]["fp32"]["sentences_per_s"] * (1 + 2 * report.QUICK_SLACK)
    assert bench.publish(quick, record=False) == 1
    assert "error: served above its raw limit" in capsys.readouterr().err
