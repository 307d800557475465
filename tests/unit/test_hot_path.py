"""The lean path answers as BentoML's own path does (serving/hot_path.py).

``hot_path_toy`` is one small service built twice, its routes untraced alike: with the lean path in
front, and as BentoML serves it. The same requests (APIs of every kind, ctx's features, a mounted
app, bodies BentoML refuses) get the same statuses, bodies and headers from both; background tasks
run; the request metrics count the same series; the traffic timeout answers alike, a stalled body
included. A traced service, or one with a middleware not declared safe, keeps BentoML's path. Each
build runs in a process of its own (BentoML registers its request metrics once per process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from serving.replies import dumps, reply
from testkit.processes import ROOT
from tests.unit.hot_path_toy import DELEGATED, REQUESTS, ROUTES


def run(scenario: str, variant: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    # BentoML's metrics are Prometheus multiprocess files, in a directory `bentoml serve` makes.
    metrics = tmp_path_factory.mktemp("prometheus")
    env = {**os.environ, "BENTOML_DO_NOT_TRACK": "True", "PROMETHEUS_MULTIPROC_DIR": str(metrics)}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.unit.hot_path_toy", scenario, variant],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def lean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run("requests", "lean", tmp_path_factory)


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run("requests", "bentoml", tmp_path_factory)


def test_the_lean_path_takes_the_untraced_post_routes_only(lean, full, tmp_path_factory) -> None:
    assert lean["routes"] == sorted(ROUTES)
    assert run("traced", "lean", tmp_path_factory) == []  # traced: BentoML's path for all
    # BentoML's endpoint answered only what the lean path hands it (a body that does not
    # validate, invalid JSON, text/plain, a missing field); traced, every API request.
    apis = [r for r in REQUESTS if not r[0].startswith("/mounted/")]
    assert lean["bentoml_answered"] == DELEGATED
    assert full["bentoml_answered"] == len(apis)


def test_both_paths_answer_alike(lean, full) -> None:
    mine, theirs = lean["answers"], full["answers"]
    for request, a, b in zip(REQUESTS, mine, theirs, strict=True):
        named = [[k, v.replace("toy_lean", "toy").replace("toy_bentoml", "toy")] for k, v in a[2]]
        assert [a[0], a[1], named] == [
            b[0], b[1], [[k, v.replace("toy_bentoml", "toy")] for k, v in b[2]]
        ], request  # fmt: skip
    statuses = [status for status, _, _ in mine]
    assert statuses == [
        200,
        200,
        200,
        404,
        429,
        500,
        400,
        200,
        200,
        201,
        201,
        200,
        422,
        400,
        400,
        200,
        400,
        404,  # BentoML's NotFound
        401,  # its authorization error
        503,  # a BentoML 5xx
    ]
    body = json.loads
    # BentoML's bodies for its own exceptions, as ConformingErrors leaves them on both paths
    assert [body(a[1])["error"] for a in mine[-3:]] == [
        "no 'x'",
        "Authorization error",
        "An unexpected error has occurred, please check the server log.",
    ]
    assert body(mine[0][1]) == {"text": "HELLO", "length": 5} and ["x-seen", "hello"] in mine[0][2]
    assert ["server", "BentoML Service/toy_lean"] in mine[0][2]
    assert ["retry-after", "3"] in mine[4][2] and body(mine[4][1])["retry_after"] == 3
    assert body(mine[7][1]) == {"rows": 2, "variant": "fp32"}  # a keyword argument's default
    # A 4xx body in the one error format on both (ConformingErrors on BentoML's path).
    assert body(mine[6][1])["error"] == "invalid request: 1 problem (see detail)"
    # ctx: shared state, the request's body and headers, one x-a (headers ignore case), BentoML's
    # Server header over the API's own, a cookie, a status
    assert body(mine[10][1]) == {"calls": 2, "agent": "t"}
    assert [h for h in mine[10][2] if h[0] in ("x-a", "server", "set-cookie")] == [
        ["server", "BentoML Service/toy_lean"], ["set-cookie", "seen=second; Path=/; SameSite=lax"],
        ["x-a", "2"],
    ]  # fmt: skip
    # a mounted app: its answer, the root path it sees, its 4xx conformed too
    assert body(mine[11][1]) == {"echo": "hi", "root": "/mounted"}
    assert body(mine[12][1]) == {"error": "no", "detail": "body: body"}


def test_the_lean_path_reads_a_models_fields_from_its_class(lean, full) -> None:
    # BentoML's endpoint reads `model_fields` on each request's instance of a keyword-argument API
    # (the toy's /kwargs), which pydantic 2.11+ warns about on every request (and V3 removes):
    # the lean path, serving the same requests, warns nothing.
    assert any("'model_fields' attribute on the instance" in w for w in full["warnings"])
    assert lean["warnings"] == []


def test_background_tasks_run_after_the_answer_on_both_paths(lean, full) -> None:
    assert lean["background"] == full["background"] == ["first", "second"]


def request_counts(
    metrics: str, name: str = "bentoml_service_request_total"
) -> dict[tuple[str, str], float]:
    counts = {}
    for line in metrics.splitlines():
        if line.startswith(name + "{"):
            inside = line[line.index("{") + 1 : line.index("}")]
            labels = dict(kv.split("=", 1) for kv in inside.split(","))
            code = labels.get("http_response_code", "").strip('"')
            counts[(labels["endpoint"].strip('"'), code)] = float(line.rsplit(" ", 1)[1])
    return counts


def test_the_request_metrics_count_the_same_series(lean, full) -> None:
    mine, theirs = request_counts(lean["metrics"]), request_counts(full["metrics"])
    assert mine == theirs
    # /model: two JSON bodies on the lean path, a text/plain one that BentoML reads as JSON
    assert mine[("/model", "200")] == 3.0 and mine[("/crash", "500")] == 1.0
    # The duration histogram counts each request once, in the same series; nothing is left in
    # progress (the lean path makes its routes' series at start, at 0; BentoML at their first
    # request). The lean path writes them a moment later: serving/tallies.py.
    durations = "bentoml_service_request_duration_seconds_count"
    assert request_counts(lean["metrics"], durations) == request_counts(full["metrics"], durations)
    assert request_counts(lean["metrics"], durations) == mine
    for answers in (lean, full):
        in_progress = request_counts(answers["metrics"], "bentoml_service_request_in_progress")
        assert in_progress.keys() >= {(path, "") for path, _ in mine}
        assert set(in_progress.values()) == {0.0}


TIMED_OUT = {"error": "Not able to process the request in 1 seconds"}


def test_the_traffic_timeout_is_the_same_on_both_paths(tmp_path_factory) -> None:
    """From arrival to the first byte sent: a slow API gets 504 (no Server header: BentoML's
    timeout answers outside the API); a stream that started in time is sent whole."""
    mine, theirs = (run("slow", v, tmp_path_factory) for v in ("lean", "bentoml"))
    assert mine == theirs == {"api": [504, TIMED_OUT, None], "stream": [200, "0123"]}


def test_a_client_that_stalls_its_body_gets_504_at_the_timeout(tmp_path_factory) -> None:
    mine, theirs = (run("stalled", v, tmp_path_factory) for v in ("lean", "bentoml"))
    assert mine == theirs == [504, TIMED_OUT]


def test_a_middleware_not_declared_safe_keeps_bentomls_path(tmp_path_factory) -> None:
    assert run("unsafe", "lean", tmp_path_factory) == []


def test_the_access_log_when_on_writes_the_same_lines(tmp_path_factory) -> None:
    mine, theirs = (run("logged", v, tmp_path_factory) for v in ("lean", "bentoml"))
    assert (
        mine
        == theirs
        == [
            "testclient:50000 (scheme=http,method=POST,path=/model,type=application/json,length=16) "
            "(status=200,type=application/json,length=27)",
            "testclient:50000 (scheme=http,method=POST,path=/refused,type=application/json,length=15) "
            "(status=404,type=application/json,length=34)",
        ]
    )


def test_pickle_is_refused_on_the_public_port_and_read_on_internal_ones(tmp_path_factory) -> None:
    public = run("public-pickle", "lean", tmp_path_factory)
    assert public[0] == 415 and public[2] == 1  # BentoML's own endpoint refuses it
    # read and answered by the lean path: BentoML's endpoint never ran
    assert run("internal-pickle", "lean", tmp_path_factory) == [
        200,
        {"rows": 1, "variant": "int8"},
        0,
    ]


def test_a_reply_is_one_sized_body_of_float32_numbers() -> None:
    vectors = np.array([[0.1, -0.42763337, 1.0]], dtype=np.float32)
    response = reply({"vectors": vectors})
    assert response.body == b'{"vectors":[[0.1,-0.42763337,1.0]]}'
    assert response.headers["content-length"] == str(len(response.body))
    # each number reads back as the same float32
    back = np.asarray(json.loads(response.body)["vectors"], dtype=np.float32)
    np.testing.assert_array_equal(back, vectors)
    # a strided view is written too, with float64's digits (longer, the same float32 values)
    strided = dumps({"v": vectors[:, ::2]})
    assert strided == b'{"v":[[0.10000000149011612,1.0]]}'
    assert np.array_equal(np.asarray(json.loads(strided)["v"], np.float32), vectors[:, ::2])


def test_a_readiness_probe_builds_the_lean_routes_before_the_first_post(tmp_path_factory) -> None:
    """The lean routes are built from BentoML's middlewares, which its first request starts: a
    probe's GET is that request, so the first POST to a hot route finds them built."""
    probed = run("probed", "lean", tmp_path_factory)
    assert probed["before"] is None and probed["probe"] == 200, probed
    assert probed["after"] == sorted(ROUTES)


def test_start_up_objects_are_frozen_once_start_up_is_complete(tmp_path_factory) -> None:
    """The lean path's service collects what start-up left unreachable and freezes the rest
    (gc.freeze), the service instance among it, so that full collections stop scanning it, and
    starts young collections later; BentoML's own leaves the collector as it was."""
    from serving.hot_path import YOUNG_COLLECTION_THRESHOLD

    lean = run("frozen", "lean", tmp_path_factory)
    assert lean["before"] == 0 and lean["after"] > 0 and lean["instance_frozen"], lean
    assert lean["garbage_collected"], lean
    (young, *older), after = lean["thresholds"]
    assert after == [YOUNG_COLLECTION_THRESHOLD, *older] and young < YOUNG_COLLECTION_THRESHOLD
    # Above what a busy tokenizer holds in requests in flight (~7,500 objects at 64 chat users).
    assert YOUNG_COLLECTION_THRESHOLD >= 5 * 7_500
    full = run("frozen", "bentoml", tmp_path_factory)
    assert full["after"] == 0 and not full["instance_frozen"], full
    assert not full["garbage_collected"], full  # nothing collected it: the check can fail
    assert full["thresholds"][1] == full["thresholds"][0]


# What each break of BentoML's internals is named by in the lean path's one warning.
BROKEN = {
    "moved-module": "cannot import name 'AccessLogMiddleware'",
    "renamed-attribute": "is_task",
    "added-layer": "unknown layer(s) in BentoML's middleware stack: __main__.Unknown",
    "unknown-version": "BentoML 9.9.9 is not a version this code was written against",
}


@pytest.mark.parametrize("scenario", list(BROKEN))
def test_what_the_lean_path_does_not_know_sends_every_request_to_bentomls_path(
    scenario: str, full, tmp_path_factory
) -> None:
    """BentoML broken on purpose as an upgrade could break it: every request is answered as
    BentoML's own path answers it (no 500 for that reason: the toy's only 500 is its /crash,
    on both paths), with one warning that names what the lean path met."""
    broken = run(scenario, "lean", tmp_path_factory)
    assert not broken["routes"]  # no lean route: BentoML's path for every request
    assert broken["bentoml_answered"] == full["bentoml_answered"]
    same = [[a[0], a[1]] for a in broken["answers"]]
    assert same == [[b[0], b[1]] for b in full["answers"]]
    assert sum(a[0] == 500 for a in broken["answers"]) == 1
    assert len(broken["logged"]) == 1, broken["logged"]
    assert BROKEN[scenario] in broken["logged"][0], broken["logged"]
    assert "takes BentoML's own path" in broken["logged"][0]


def test_the_setting_forces_the_lean_path_on_an_unknown_version(lean, tmp_path_factory) -> None:
    forced = run("unknown-version-forced", "lean", tmp_path_factory)
    assert forced["routes"] == sorted(ROUTES) and forced["logged"] == []
    assert [a[:2] for a in forced["answers"]] == [a[:2] for a in lean["answers"]]
