"""What ``make bench`` does with a finished run (``bench.publish``): a run within its raw limits is
recorded (loadtests/results/DATE.json and loadtests/README.md's figures) and exits 0; a run with a
served figure above its backend's raw limit records nothing and exits 1. The run is the newest
recorded one, published into a scratch copy of the tree's paths."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from loadtests import bench, readme_blocks, report
from loadtests.points import STACK
from loadtests.processes import ROOT

RECORDED = sorted((ROOT / "loadtests" / "results").glob("*.json"))
EMPTY = f"{report.BEGIN}\nno figures\n{report.END}"


@pytest.fixture
def run() -> dict:
    assert RECORDED, "no benchmark run is recorded in loadtests/results to publish again"
    return json.loads(RECORDED[-1].read_text())


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """build/bench, loadtests/results and loadtests/README.md, in ``tmp_path``."""
    out, results = tmp_path / "build" / "bench", tmp_path / "loadtests" / "results"
    readme = tmp_path / "loadtests" / "README.md"
    out.mkdir(parents=True)
    readme.parent.mkdir(parents=True)
    # The README with no figures between its markers: a run that is recorded puts them there.
    text = readme_blocks.README.read_text()
    start, stop = text.index(report.BEGIN), text.index(report.END) + len(report.END)
    readme.write_text(text[:start] + EMPTY + text[stop:])
    monkeypatch.setattr(bench, "OUT", out)
    monkeypatch.setattr(bench, "RESULTS", results)
    monkeypatch.setattr(readme_blocks, "README", readme)
    monkeypatch.setattr(report, "README", readme)  # in what the run says it wrote
    monkeypatch.setattr(report, "ROOT", tmp_path)  # the README names the record from the root
    monkeypatch.setattr(report, "plot", lambda results, out: [])  # matplotlib: not the subject
    return {"out": out, "results": results, "readme": readme}


def test_a_run_within_its_limits_is_recorded_and_exits_0(run, scratch, capsys) -> None:
    assert bench.publish(run, record=True) == 0
    recorded = scratch["results"] / f"{run['meta']['date'][:10]}.json"
    assert json.loads(recorded.read_text()) == run
    assert json.loads((scratch["out"] / "results.json").read_text()) == run
    assert report.readme_figures() == report.readme_block(recorded)
    assert f"commit {run['meta']['commit']}" in report.readme_figures()
    said = capsys.readouterr()
    assert "error:" not in said.err and str(recorded) in said.out


def test_a_run_not_to_record_writes_only_build_bench(run, scratch) -> None:
    assert bench.publish(run, record=False) == 0
    assert json.loads((scratch["out"] / "results.json").read_text()) == run
    assert (scratch["out"] / "results.md").read_text().strip() == report.markdown(run).strip()
    assert not scratch["results"].exists()
    assert report.readme_figures() == EMPTY


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
    assert report.readme_figures() == EMPTY
    # Kept in build/bench for a look at what went wrong.
    assert json.loads((scratch["out"] / "results.json").read_text()) == wrong
    err = capsys.readouterr().err
    assert "served above its raw limit" in err and f"{STACK} chat {chat['users']}" in err
