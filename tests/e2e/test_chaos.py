"""The bounded version of `make chaos` (a few seconds a phase): overload at 4x capacity is refused
on arrival with Retry-After while admitted requests keep a bounded p99 and are served (one the stack
slowed down on after admitting it may wait out its deadline: counted apart, at most a tenth); the stack recovers when the load
drops; SIGKILLed workers (ONNX runner, tokenizer) are restarted and the stack serves again within
one check of BentoML's supervisor and a start-up. Every outcome is counted by status: no 5xx but 503, no transport error beyond the requests
in flight at a kill, every answer equal to the reference embedding, no hang, and every worker alive
and serving at the end. The figures are printed for the note."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from loadtests import chaos
from loadtests.processes import Server, bentoml_serve
from services.tokenizer.settings import TokenizerSettings
from tests.e2e.conftest import log_path

DEADLINE_MS = TokenizerSettings().deadline_s * 1000


@pytest.fixture(scope="module")
def chaos_graph() -> Iterator[Server]:
    with bentoml_serve(".", log_path("chaos-graph.log")) as server:
        yield server


@pytest.fixture(scope="module")
def report(chaos_graph: Server) -> dict:
    result = asyncio.run(chaos.run(chaos_graph.url, chaos_graph, seconds=8))
    print(json.dumps(result, indent=1))
    print(chaos.render(result))
    return result


def phase(report: dict, name: str) -> dict:
    return next(p for p in report["phases"] if p["phase"] == name)


def test_every_outcome_is_counted_and_every_answer_is_right(report: dict) -> None:
    assert {p["phase"] for p in report["phases"]} >= {
        "overload 4x",
        "kill tokenizer",
        "recovery probes",
    }
    for p in report["phases"]:
        assert p["requests"] > 0, p
        assert p["wrong_answers"] == 0, p["other_error_kinds"]  # vectors equal the reference
        assert p["server_errors"] == 0, p["other_error_kinds"]  # no 5xx but 503 (500, 502, 504)
        unexpected = set(p["statuses"]) - {"200", "429", "503", "0"}
        assert not unexpected, p["other_error_kinds"]


def test_overload_is_refused_at_the_door_with_retry_after(report: dict) -> None:
    overload = phase(report, "overload 4x")
    assert overload["refused"] > 0, overload  # 4x capacity cannot all be admitted
    assert overload["refused_without_retry_after"] == 0
    # Refused on arrival (the server's reason is not a deadline that passed while it waited), so
    # before the deadline it would otherwise have waited out: a contract, not a speed figure.
    assert overload["refusal_p99_ms"] < DEADLINE_MS, overload
    assert overload["other_errors"] == 0, overload["other_error_kinds"]


def test_admitted_requests_are_served_not_left_to_expire(report: dict) -> None:
    """Admission plans to 90 % of the deadline, so what it admits is served: only if the stack
    slows after admitting does a request wait out its deadline (503, Retry-After), and then no
    later than the deadline."""
    overload = phase(report, "overload 4x")
    admitted = overload["served"] + overload["expired"]
    assert overload["expired"] <= 0.1 * admitted, overload
    if overload["expired"]:
        assert overload["expired_max_ms"] <= DEADLINE_MS + 2000, overload


def test_admitted_requests_keep_a_bounded_p99(report: dict) -> None:
    overload = phase(report, "overload 4x")
    assert overload["served"] > 0
    assert overload["served_p99_ms"] <= DEADLINE_MS + 2000, overload


def test_throughput_recovers_after_the_load_drops(report: dict) -> None:
    assert report["recovery_after_overload_s"] is not None
    assert report["recovery_after_overload_s"] < 30


def test_no_transport_error_outside_a_kill(report: dict) -> None:
    for p in report["phases"]:
        if not p["phase"].startswith("kill"):
            assert p["transport_errors"] == 0, p


# BentoML's supervisor (circus) looks at its processes every 10 s (check_delay=10 in
# bentoml/_internal/utils/circus: lower, it raises ConflictError at start), so a killed worker is
# respawned at the next check, 0-10 s after the kill, then starts (the ONNX runner alone: 2.2-2.9 s
# to ready here). Measured in this test: 3.6-5.5 s for the tokenizer, 9.9-11.6 s for the ONNX runner.
SUPERVISOR_CHECK_S, START_S = 10, 5


@pytest.mark.parametrize("service", ["onnx_runner", "tokenizer"])
def test_a_killed_worker_is_restarted_and_the_stack_serves_after_one_supervisor_check(
    report: dict, service: str
) -> None:
    kill = next(k for k in report["kills"] if k["service"] == service)
    bound = SUPERVISOR_CHECK_S + START_S
    assert kill["serving_again_s"] is not None and kill["serving_again_s"] <= bound, kill
    during = phase(report, f"kill {service}")
    # Only a connection open at the kill may be lost (a request on it in flight, or sent on it
    # before the client saw it closed); every request on a new connection is answered.
    assert during["transport_errors"] <= during["connections_at_kill"], during
    if service == "onnx_runner":  # the tokenizer answers for it: 503 at worst, never a reset
        assert during["transport_errors"] == 0, during
    slowest = during["slowest_failure_ms"] or 0
    assert slowest < chaos.CLIENT_TIMEOUT_S * 1000, during  # failures are answers, not hangs


def test_every_worker_is_alive_and_serving_after_the_run(report: dict) -> None:
    assert report["server_alive"]
    assert report["workers_serving"] == dict.fromkeys(
        ("tokenizer", "onnx_runner", "tf_runner", "tenant_runner"), True
    )
