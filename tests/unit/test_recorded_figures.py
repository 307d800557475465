"""loadtests/results/results.md is the recorded benchmark run's: the newest
loadtests/results/DATE.json as the report renders it; every recorded run is a full one (not quick,
at least 3 repeats, from a committed tree) whose table and ratios are those its own points give,
with no served figure above its raw limit. Likewise the profile (loadtests/results/profile.md)."""

from __future__ import annotations

import json
import math

from loadtests import report
from testkit.processes import ROOT

RECORDED = sorted((ROOT / "loadtests" / "results").glob("*.json"))


def test_results_md_is_the_newest_recorded_run() -> None:
    assert RECORDED, "no benchmark run is recorded in loadtests/results"
    newest = RECORDED[-1]
    assert report.RESULTS_MD.read_text() == report.results_md(newest), (
        f"loadtests/results/results.md is not {newest.name}'s as the report renders it now: "
        f"regenerate it with `python -m loadtests.report {newest.relative_to(ROOT)}`"
    )


def test_every_recorded_run_is_full_and_within_its_raw_limits() -> None:
    for recorded in RECORDED:
        data = json.loads(recorded.read_text())
        meta = data["meta"]
        assert meta["quick"] is False and meta["repeats"] >= 3, (recorded.name, meta)
        # A commit anyone can check out: not "+changes" (measured from an uncommitted tree).
        assert len(meta["commit"]) >= 7 and "+" not in meta["commit"], (recorded.name, meta)
        assert recorded.stem == meta["date"][:10]
        assert report.above_raw(data) == [], recorded.name
        for backend, limit in data["raw"].items():  # the limit is the best plan's median
            assert limit["sentences_per_s"] == limit["by_plan"][limit["plan"]], recorded.name
            assert limit["sentences_per_s"] == max(limit["by_plan"].values()), recorded.name
            # measured at the run's start and end: each plan's best of the measurements kept whole
            measured = [run["by_plan"] for run in limit.get("runs", []) if "by_plan" in run]
            if measured:
                assert limit["by_plan"] == {
                    plan: max(m[plan] for m in measured) for plan in limit["by_plan"]
                }, (recorded.name, backend)
        # The table is its points' medians (a row edited by hand fails), the ratios its quotients.
        rows = json.loads(json.dumps(report.table(report.points_of(data))))
        assert data["rows"] == rows, recorded.name
        assert data["ratios"] == report.ratios(rows, data["raw"]), recorded.name
        for row in data["rows"]:  # every system's points, interleaved, once a repeat
            assert row["repeats"] == meta["repeats"], (recorded.name, row)


PROFILES = sorted((ROOT / "loadtests" / "results" / "profiles").glob("*.json"))


def test_profile_md_is_the_newest_recorded_one(tmp_path, monkeypatch) -> None:
    from loadtests import profile

    assert PROFILES, "no profile is recorded in loadtests/results/profiles"
    shown = profile.PROFILE_MD.read_text()
    monkeypatch.setattr(profile, "PROFILE_MD", tmp_path / "profile.md")
    assert shown == profile.render(PROFILES[-1]).read_text(), (
        "loadtests/results/profile.md is not the newest recorded profile: regenerate it with "
        f"`python -m loadtests.profile --render {PROFILES[-1].relative_to(ROOT)}`"
    )


def test_every_recorded_profile_accounts_for_its_processes_cpu() -> None:
    for recorded in PROFILES:
        data = json.loads(recorded.read_text())
        run = data["profile"]
        assert "+" not in data["meta"]["commit"] and run["failed"] == 0, recorded.name
        assert run["seconds"] >= 30 and run["requests"] > 0, recorded.name
        for name, p in run["processes"].items():
            for kind in ("main", "other_threads"):
                # every ms of the thread's CPU is in a category, from enough samples to share it
                total = p["from_proc"][f"{kind}_ms"]
                assert math.isclose(sum(p[kind].values()), total, abs_tol=1e-3), (name, kind)
                assert p["samples"][kind] >= 500 or total < 0.01, (recorded.name, name, kind)
