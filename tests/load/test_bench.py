"""`BENCH_QUICK=1 make bench` works end to end and its figures hold together: every system measured
once, the raw limit above every served figure of its backend (within a quick run's slack), ratios and medians from the points,
the CPU of every server process, the runner's split between its engine and the rest."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

from testkit.processes import ROOT, run_tree


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "BENCH_QUICK": "1", "BENCH_OUT": str(out), "BENTOML_DO_NOT_TRACK": "True"}
    # run_tree: on a timeout the benchmark's servers are stopped by PID with it
    proc = run_tree([sys.executable, "-m", "loadtests.bench"], 900, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| workload | users | system |" in proc.stdout
    return json.loads((out / "results.json").read_text()), out


def test_the_run_records_how_it_ran_and_every_restart(results) -> None:
    data, _ = results
    from loadtests.bench import QUICK_SETTLE_S

    meta = data["meta"]
    # BENCH_QUICK's loads (this process imported loadtests.points without it: the full run's)
    assert meta["quick"] is True and meta["users"] == [1, 8] and meta["middle"] == 8
    assert meta["settle_s"] == QUICK_SETTLE_S  # the timeout the run drained with, a quick run's
    # every restart a systems' point recorded is counted (the other points' add to the count)
    counted = data["restarts"]
    for name in {n for p in data["points"] for n in p["restarted"]}:
        assert counted[name] >= sum(p["restarted"].count(name) for p in data["points"])
    assert all(n > 0 for n in counted.values())


def test_every_system_is_measured_with_non_zero_figures(results) -> None:
    data, _ = results
    from loadtests.points import FASTAPI, STACK, SYSTEMS, WORKLOADS

    assert data["raw"]["fp32"]["sentences_per_s"] > 0 and data["raw"]["int8"]["sentences_per_s"] > 0
    seen = {(r["system"], r["workload"], r["users"]) for r in data["rows"]}
    one, middle = data["meta"]["users"]
    # a quick run: every system at its middle load on both workloads, the stack and FastAPI at one
    # client too (the one-client target compares them)
    expected = {(s, w, middle) for s in SYSTEMS for w in WORKLOADS}
    expected |= {(STACK, "chat", one), (FASTAPI, "chat", one)}
    assert seen == expected
    for p in data["points"]:
        assert p["requests"] > 0 and p["sentences_per_s"] > 0, p
        assert 0 < p["p50_ms"] <= p["p99_ms"], p
        assert 0 <= p["loadgen_cpu_share"] <= 1


def test_raw_is_measured_per_model_and_backend(results) -> None:
    data, _ = results
    from serving import catalogue

    served = catalogue.load(catalogue.DEFAULT).default()
    assert served is not None
    for key, backend in (("fp32", "onnx"), ("int8", "onnx-int8")):
        assert (data["raw"][key]["model"], data["raw"][key]["backend"]) == (served.name, backend)


def test_one_model_is_measured_alone_and_beside_another_saturated(results) -> None:
    data, out = results
    several = data["several_models"]
    assert several["model_a"] != several["model_b"]
    assert 0 < several["b_alone_p50_ms"] <= several["b_alone_p99_ms"]
    assert 0 < several["b_beside_a_p50_ms"] <= several["b_beside_a_p99_ms"]
    assert several["b_failed"] == 0  # B is answered while A is saturated, never refused
    assert several["a_sentences_per_s"] > 0
    assert several["b_p99_ratio"] == round(
        several["b_beside_a_p99_ms"] / several["b_alone_p99_ms"], 2
    )
    assert "Several models on one graph" in (out / "results.md").read_text()


def test_rerank_and_classify_are_served_beside_their_raw_engine(results) -> None:
    """A row for each of the default catalogue's heads: the inputs a second served, the raw
    engine's on the same inputs, their quotient, and the CPU a request cost the front and the
    runner (whose engine share is counted apart)."""
    data, out = results
    rows = {r["task"]: r for r in data["tasks"]}
    assert {task: r["route"] for task, r in rows.items()} == {
        "rerank": "/rerank",
        "classify": "/predict",
    }
    assert (rows["rerank"]["model"], rows["classify"]["model"]) == (
        "intent-reranker",
        "intent-classifier",
    )
    for r in rows.values():
        assert r["served_per_s"] > 0 and r["raw_per_s"] > 0 and r["failures"] == 0, r
        assert math.isclose(r["served_over_raw"], r["served_per_s"] / r["raw_per_s"], rel_tol=1e-2)
        assert 0 < r["p50_ms"] <= r["p99_ms"]
        cpu = r["cpu_ms_per_request"]
        assert cpu["tokenizer"]["total_ms"] > 0 and cpu["onnx_runner"]["engine_ms"] > 0, cpu
    assert "| rerank | intent-reranker | /rerank |" in (out / "results.md").read_text()


def test_raw_is_the_limit_of_every_served_figure_of_its_backend_within_a_quick_runs_slack(
    results,
) -> None:
    data, _ = results
    from loadtests.report import QUICK_SLACK, above_raw, backend_of

    # a quick run's raw limit (one timing of a plan of each kind, at its start and at its end)
    # may sit under a served figure by up to its slack
    slack = 1 + (QUICK_SLACK if data["meta"]["quick"] else 0.0)
    for row in data["rows"]:
        limit = data["raw"][backend_of(row["system"])]["sentences_per_s"]
        assert row["sentences_per_s"] <= slack * limit, row
    assert above_raw(data) == []
    # raw is the best of both kinds of plan, each measured
    for backend in ("fp32", "int8"):
        plans = data["raw"][backend]["by_plan"]
        assert any(k.startswith("rows") for k in plans) and any(
            k.startswith("tokens") for k in plans
        )
        assert data["raw"][backend]["sentences_per_s"] == max(plans.values())
        # measured at the run's start and at its end (each plan's best kept), a quick run too
        runs = data["raw"][backend]["runs"]
        assert len(runs) == 2
        assert all(plans[p] == max(r["by_plan"][p] for r in runs) for p in plans)
        # both thread layouts, one session on every core and one per core (the stack's lanes)
        assert {k.split(", ")[1] for k in plans} == {"1 session", "2 lanes"}


def test_ratios_are_the_quotients_of_the_throughputs_they_name(results) -> None:
    data, _ = results
    from loadtests.points import FASTAPI, HANDWRITTEN, INT8, NAIVE, NOBATCH, STACK

    sps = {(r["system"], r["workload"], r["users"]): r["sentences_per_s"] for r in data["rows"]}
    raw = data["raw"]
    middle = data["meta"]["middle"]
    assert {(r["workload"], r["users"]) for r in data["ratios"]} >= {
        ("chat", middle),
        ("bulk", middle),
    }
    for row in data["ratios"]:
        if row["users"] != middle:  # at one client, only the stack and FastAPI are measured
            assert math.isclose(
                row["vs_fastapi"],
                row["stack_sentences_per_s"] / sps[(FASTAPI, row["workload"], row["users"])],
                rel_tol=1e-3,
            )
            continue
        key = (row["workload"], row["users"])
        stack = sps[(STACK, *key)]
        assert math.isclose(row["stack_sentences_per_s"], stack)
        assert math.isclose(
            row["served_over_raw"], stack / raw["fp32"]["sentences_per_s"], rel_tol=1e-3
        )
        # int8 is divided by its own raw limit, not fp32's
        int8 = sps[(INT8, *key)]
        assert math.isclose(
            row["int8_served_over_raw"], int8 / raw["int8"]["sentences_per_s"], rel_tol=1e-3
        )
        assert math.isclose(row["int8_over_fp32"], int8 / stack, rel_tol=1e-3)
        for name, system in (
            ("vs_fastapi", FASTAPI),
            ("vs_naive", NAIVE),
            ("vs_batching_off", NOBATCH),
            ("vs_handwritten", HANDWRITTEN),
        ):
            assert math.isclose(row[name], stack / sps[(system, *key)], rel_tol=1e-3), name
    assert len(data["targets"]) >= 10  # each target reported, met or not


def test_medians_and_spreads_come_from_the_points(results) -> None:
    data, _ = results
    for row in data["rows"]:
        rates = [
            p["sentences_per_s"]
            for p in data["points"]
            if (p["system"], p["workload"], p["users"])
            == (row["system"], row["workload"], row["users"])
        ]
        assert len(rates) == row["repeats"] and row["spread"] == [
            round(min(rates), 2),
            round(max(rates), 2),
        ]


def test_per_request_cpu_is_measured_for_every_server_process(results) -> None:
    data, _ = results
    expected = {
        "stack": {"tokenizer", "onnx_runner"},
        "stack, int8": {"tokenizer", "onnx_runner"},
        "stack, batching off": {"tokenizer", "onnx_runner"},
        "naive bentoml": {"NaiveFront", "NaiveOnnx"},
        "fastapi": {"uvicorn"},
        "hand-written batching": {"uvicorn"},
    }
    # Every process of a BentoML graph is measured, the arbiter and the runners a workload does
    # not use included (those may spend nothing on it); the ones on the request's path spend CPU.
    graph = {"bentoml serve (arbiter)", "tokenizer", "onnx_runner", "tf_runner", "tenant_runner"}
    every = {
        "stack": graph,
        "stack, int8": graph,
        "stack, batching off": graph,
        "naive bentoml": {"bentoml serve (arbiter)", "NaiveFront", "NaiveOnnx"},
        "fastapi": {"uvicorn"},
        "hand-written batching": {"uvicorn"},
    }
    for row in data["rows"]:
        cpu = row["cpu_ms_per_request"]
        assert set(cpu) == every[row["system"]], (row["system"], set(cpu))
        for name, used in cpu.items():
            assert used["main_ms"] >= 0 and used["other_threads_ms"] >= 0, (row["system"], name)
            assert math.isclose(
                used["total_ms"], used["main_ms"] + used["other_threads_ms"], abs_tol=2e-4
            )
        for name in expected[row["system"]]:
            assert cpu[name]["total_ms"] > 0, (row["system"], name, cpu[name])


def test_the_stack_s_runner_splits_its_cpu_into_the_engine_and_the_rest(results) -> None:
    """At every point, the ONNX runner's engine CPU, counted around its engine calls (a lane's
    thread; a solo call: every thread but the event loop, which is the worker's main thread) and
    read from /metrics, is a share of its other threads' CPU from /proc (the lanes' and the
    engine's own threads; 5 % for the process clock's lag and threads gone by the snapshot), and
    everything else (serving_ms, what the runner's CPU target reads) is at least its event
    loop's."""
    data, _ = results
    split = [p for p in data["points"] if p["system"] in ("stack", "stack, int8")]
    assert split
    for point in split:
        runner = point["cpu_ms_per_request"]["onnx_runner"]
        assert runner["engine_ms"] > 0, point
        assert runner["engine_ms"] <= runner["other_threads_ms"] * 1.05, point
        assert math.isclose(
            runner["serving_ms"], runner["total_ms"] - runner["engine_ms"], abs_tol=2e-4
        )
        assert runner["serving_ms"] >= runner["main_ms"] - 0.05 * runner["total_ms"], point
        # Only the runners count their engine's CPU: the tokenizer's figures are not split.
        assert "engine_ms" not in point["cpu_ms_per_request"]["tokenizer"], point


def test_the_table_and_the_targets_are_written(results) -> None:
    data, out = results
    text = (out / "results.md").read_text()
    assert "| workload | users | system |" in text and "Where the CPU goes" in text
    assert all(t["target"] in text for t in data["targets"])
