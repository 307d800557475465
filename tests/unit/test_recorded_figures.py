"""loadtests/README.md's figures are the recorded benchmark run's: the block between its markers is
the newest loadtests/results/DATE.json as the report renders it (no figures while none is
recorded), and every recorded run is a full one (not quick, at least 3 repeats, each row of the
systems' table a median over every repeat) with no served figure above its raw limit."""

from __future__ import annotations

import json

from loadtests import report
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
        assert len(meta["commit"]) >= 7, (recorded.name, meta)
        assert recorded.stem == meta["date"][:10]
        assert report.above_raw(data) == [], recorded.name
        for row in data["rows"]:  # every system's points, interleaved, once a repeat
            assert row["repeats"] == meta["repeats"], (recorded.name, row)
