"""The lean path answers as BentoML's own path does (serving/hot_path.py).

``hot_path_toy`` is one small service built twice: its routes kept out of tracing (the lean path
takes them) and traced (BentoML's path takes everything). The same requests get the same statuses,
bodies and headers from both; the request metrics count them the same; the traffic timeout answers
504 the same; bodies that do not validate are answered by BentoML on both. Each build runs in a
process of its own (BentoML registers its request metrics once per process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from loadtests.processes import ROOT
from serving.replies import dumps, reply
from tests.unit.hot_path_toy import REQUESTS, ROUTES


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
    return run("requests", "full", tmp_path_factory)


def test_the_lean_path_takes_the_untraced_apis_only(lean, full) -> None:
    assert lean["routes"] == sorted(ROUTES)
    assert full["routes"] == []  # traced: BentoML's path for everything
    # BentoML's endpoint answered only what the lean path hands it (the last four requests: a
    # body that does not validate, invalid JSON, text/plain, a missing field); traced, all.
    assert lean["bentoml_answered"] == 4
    assert full["bentoml_answered"] == len(REQUESTS)


def test_both_paths_answer_alike(lean, full) -> None:
    mine, theirs = lean["answers"], full["answers"]
    for request, a, b in zip(REQUESTS, mine, theirs, strict=True):
        a[2]["server"] = a[2]["server"] and a[2]["server"].replace("toy_lean", "toy")
        b[2]["server"] = b[2]["server"] and b[2]["server"].replace("toy_full", "toy")
        assert a == b, request
    statuses = [status for status, _, _ in mine]
    assert statuses == [200, 200, 200, 404, 429, 500, 400, 200, 200, 400, 400, 200, 400]
    assert mine[0][1] == {"text": "HELLO", "length": 5} and mine[0][2]["x-seen"] == "hello"
    assert mine[0][2]["server"] == "BentoML Service/toy"
    assert mine[4][2]["retry-after"] == "3" and mine[4][1]["retry_after"] == 3
    assert mine[7][1] == {"rows": 2, "variant": "fp32"}  # the default of a keyword argument
    # A 4xx body in the one error format on both (ConformingErrors on BentoML's path).
    assert mine[6][1]["error"] == "invalid request: 1 problem (see detail)"


def request_counts(metrics: str) -> dict[tuple[str, str], float]:
    counts = {}
    for line in metrics.splitlines():
        if line.startswith("bentoml_service_request_total{"):
            inside = line[line.index("{") + 1 : line.index("}")]
            labels = dict(kv.split("=", 1) for kv in inside.split(","))
            key = (labels["endpoint"].strip('"'), labels["http_response_code"].strip('"'))
            counts[key] = float(line.rsplit(" ", 1)[1])
    return counts


def test_the_request_metrics_count_the_same_series(lean, full) -> None:
    mine, theirs = request_counts(lean["metrics"]), request_counts(full["metrics"])
    assert mine == theirs
    # /model: two JSON bodies on the lean path, a text/plain one that BentoML reads as JSON
    assert mine[("/model", "200")] == 3.0 and mine[("/crash", "500")] == 1.0


@pytest.mark.parametrize("variant", ["lean", "full"])
def test_the_traffic_timeout_answers_504(variant: str, tmp_path_factory) -> None:
    answer = run("slow", variant, tmp_path_factory)
    assert answer == {
        "status": 504,
        "body": {"error": "Not able to process the request in 1 seconds"},
    }


def test_the_access_log_when_on_writes_the_same_lines(tmp_path_factory) -> None:
    mine, theirs = (run("logged", v, tmp_path_factory) for v in ("lean", "full"))
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
    assert run("public-pickle", "lean", tmp_path_factory)[0] == 415
    assert run("internal-pickle", "lean", tmp_path_factory) == [200, {"rows": 1, "variant": "int8"}]


def test_a_reply_is_one_sized_body_of_float32_numbers() -> None:
    vectors = np.array([[0.1, -0.42763337, 1.0]], dtype=np.float32)
    response = reply({"vectors": vectors})
    assert response.body == b'{"vectors":[[0.1,-0.42763337,1.0]]}'
    assert response.headers["content-length"] == str(len(response.body))
    # each number reads back as the same float32; a strided view is written too
    back = np.asarray(json.loads(response.body)["vectors"], dtype=np.float32)
    np.testing.assert_array_equal(back, vectors)
    assert dumps({"v": vectors[:, ::2]}) == b'{"v":[[0.10000000149011612,1.0]]}'
