"""`BENCH_QUICK=1 make bench` works end to end and its figures hold together."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.processes import ROOT


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "BENCH_QUICK": "1", "BENCH_OUT": str(out), "BENTOML_DO_NOT_TRACK": "True"}
    proc = subprocess.run(
        [sys.executable, "-m", "loadtests.bench"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| workload | users | system |" in proc.stdout
    return json.loads((out / "results.json").read_text()), out


def test_every_system_is_measured_with_non_zero_figures(results) -> None:
    data, _ = results
    from loadtests.points import INT8, SYSTEMS, WORKLOADS

    users_run, middle = data["meta"]["users"], data["meta"]["middle_users"]
    assert data["raw"]["fp32"]["sentences_per_s"] > 0 and data["raw"]["int8"]["sentences_per_s"] > 0
    seen = {(p["system"], p["workload"], p["users"]) for p in data["points"]}
    for system in SYSTEMS:
        for workload in WORKLOADS:
            for users in [middle] if system == INT8 else users_run:
                assert (system, workload, users) in seen
    for p in data["points"]:
        assert (
            p["requests"] > 0
            and p["sentences_per_s"] > 0
            and p["p50_ms"] > 0
            and p["p99_ms"] >= p["p50_ms"]
        ), p
        assert 0 <= p["loadgen_cpu_share"] <= 1


def test_ratios_are_the_quotients_of_the_throughputs_they_name(results) -> None:
    data, _ = results
    from loadtests.points import FASTAPI, INT8, NAIVE, NOBATCH, STACK

    sps = {(p["system"], p["workload"], p["users"]): p["sentences_per_s"] for p in data["points"]}
    raw = data["raw"]["fp32"]["sentences_per_s"]
    for row in data["ratios"]:
        key = (row["workload"], row["users"])
        stack = sps[(STACK, *key)]
        assert math.isclose(row["stack_sentences_per_s"], stack)
        assert math.isclose(row["served_over_raw"], stack / raw)
        assert math.isclose(row["vs_fastapi"], stack / sps[(FASTAPI, *key)])
        assert math.isclose(row["vs_naive"], stack / sps[(NAIVE, *key)])
        assert math.isclose(row["vs_batching_off"], stack / sps[(NOBATCH, *key)])
        if (INT8, *key) in sps:
            assert math.isclose(row["int8_over_fp32"], sps[(INT8, *key)] / stack)
    assert {t["target"] for t in data["targets"]}  # each target reported, met or not


def test_plots_are_written(results) -> None:
    _, out = results
    for workload in ("chat", "bulk"):
        png = out / f"{workload}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert (out / "results.md").read_text().count("\n") > 10
