"""loadtests/README.md's figures are the recorded benchmark run's: the block between its markers is
the newest loadtests/results/DATE.json as the report renders it (no figures while none is
recorded), and every recorded run is a full one (not quick, at least 3 repeats, from a committed
tree) whose table and ratios are those its own points give, with no served figure above its raw
limit."""

from __future__ import annotations

import json

from loadtests import report
from loadtests.points import Point
from loadtests.processes import ROOT

RECORDED = sorted((ROOT / "loadtests" / "results").glob("*.json"))


def test_readme_figures_are_the_newest_recorded_runs() -> None:
    figures = report.readme_figures()
    if not RECORDED:
        assert "No run of this benchmark is recorded yet" in figures and "|" not in figures
        return
    newest = RECORDED[-1]
    assert figures == report.readme_block(newest), (
        f"loadtests/README.md's figures are not {newest.name}'s as the report renders them now: "
        f"regenerate them with `python -m loadtests.report {newest.relative_to(ROOT)}`"
    )


def test_every_recorded_run_is_full_and_within_its_raw_limits() -> None:
    if not RECORDED:  # then the README has no figures: the test above
        assert "No run of this benchmark is recorded yet" in report.readme_figures()
    for recorded in RECORDED:
        data = json.loads(recorded.read_text())
        meta = data["meta"]
        assert meta["quick"] is False and meta["repeats"] >= 3, (recorded.name, meta)
        # A commit anyone can check out: not "+changes" (measured from an uncommitted tree).
        assert len(meta["commit"]) >= 7 and "+" not in meta["commit"], (recorded.name, meta)
        assert recorded.stem == meta["date"][:10]
        assert report.above_raw(data) == [], recorded.name
        # The table is its points' medians (a row edited by hand fails), the ratios its quotients.
        rows = json.loads(json.dumps(report.table([Point(**p) for p in data["points"]])))
        assert data["rows"] == rows, recorded.name
        assert data["ratios"] == report.ratios(rows, data["raw"]), recorded.name
        for row in data["rows"]:  # every system's points, interleaved, once a repeat
            assert row["repeats"] == meta["repeats"], (recorded.name, row)
