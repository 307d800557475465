"""The compose stack from real images (`make test-containers`): smoke, a headless Locust run with 0
failures, Prometheus scraping every service with its rules evaluating, a runner restarted and the
stack serving again, tenant models kept across re-creation.

Needs a running Docker engine and the images (`make images`); the make target provides both and
stops what it started. Without an engine these tests fail, they do not skip.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from loadtests.processes import ROOT, free_port
from models import demo_tenants as demo
from tests.e2e.test_locust_smoke import run_locust

COMPOSE_FILE = ROOT / "deploy" / "compose" / "docker-compose.yml"
PROJECT = f"bundle-test-{uuid.uuid4().hex[:6]}"
LOGS = ROOT / "build" / "test-logs"
PAIR = ["A man is eating food.", "A man is eating a piece of bread."]


def compose(*args: str, env: dict[str, str], timeout: float = 600) -> str:
    argv = ["docker-compose", "-p", PROJECT, "-f", str(COMPOSE_FILE), *args]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args)}: {proc.stderr[-3000:]}"
    return proc.stdout


def wait_serving(client: httpx.Client, seconds: float = 240) -> float:
    """Seconds until an embedding comes back through the tokenizer (runners included)."""
    started = time.monotonic()
    while True:
        try:
            if client.post("/embed", json={"texts": ["ready?"]}).status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        if time.monotonic() - started > seconds:
            raise AssertionError(f"the stack did not serve within {seconds:.0f} s")
        time.sleep(1)


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    # /usr/bin first: Debian's docker client (see deploy/engine/engine.sh).
    env = {
        **os.environ,
        "PATH": f"/usr/bin:{os.environ['PATH']}",
        "IMAGE_TAG": os.environ.get("IMAGE_TAG", "latest"),
        "TOKENIZER_PORT": str(free_port()),
        "PROMETHEUS_PORT": str(free_port()),
        "ADMIN_ENABLED": "true",  # the test trains a tenant through the public service
    }
    subprocess.run(["docker", "info"], env=env, capture_output=True, check=True)
    try:
        compose("up", "-d", env=env)
        with httpx.Client(base_url=f"http://127.0.0.1:{env['TOKENIZER_PORT']}", timeout=60) as c:
            wait_serving(c)
            yield c, env
    finally:
        LOGS.mkdir(parents=True, exist_ok=True)
        logs = subprocess.run(
            ["docker-compose", "-p", PROJECT, "-f", str(COMPOSE_FILE), "logs", "--no-color"],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
        (LOGS / "compose.log").write_text(logs.stdout + logs.stderr)
        compose("down", "-v", "--remove-orphans", env=env)


def test_only_the_tokenizer_and_prometheus_are_published(stack) -> None:
    _, env = stack
    ports = compose("ps", env=env)
    assert f"127.0.0.1:{env['TOKENIZER_PORT']}->3000/tcp" in ports
    assert f"127.0.0.1:{env['PROMETHEUS_PORT']}->9090/tcp" in ports
    assert ports.count("->") == 2, ports


def test_smoke_embed_similarity_tokenize(stack) -> None:
    client, _ = stack
    for backend in ("onnx", "onnx-int8", "tf"):
        reply = client.post("/embed", json={"texts": PAIR, "backend": backend})
        assert reply.status_code == 200, reply.text
        vectors = np.array(reply.json()["embeddings"])
        assert vectors.shape == (2, 384)
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-3)
    scores = client.post("/similarity", json={"pairs": [PAIR], "threshold": 0.5}).json()
    assert abs(scores["scores"][0] - 0.755) < 0.01 and scores["labels"] == [1]
    ids = client.post("/tokenize", json={"texts": ["hello world"], "tokenizer": "minilm"}).json()
    assert ids["ids"] == [[101, 7592, 2088, 102]]


def test_train_and_classify_a_tenant(stack) -> None:
    client, _ = stack
    spec = demo.tenant(7)
    examples = [{"text": t, "intent": i} for t, i in spec.train]
    trained = client.post("/tenants/train", json={"tenant": spec.name, "examples": examples})
    assert trained.status_code == 200, trained.text
    text, intent = spec.train[0]
    reply = client.post("/classify", json={"tenant": spec.name, "texts": [text]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["intents"] == [intent]


def test_headless_locust_has_no_failures(stack) -> None:
    client, _ = stack
    proc, total = run_locust(
        str(client.base_url).rstrip("/"), "ChatUser", 8, 15, ROOT / "build" / "locust" / "compose"
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert int(total["Request Count"]) > 50 and int(total["Failure Count"]) == 0


JOBS = {"tokenizer": "tokenizer", "onnx-runner": "onnx_runner", "tf-runner": "tf_runner",
        "tenant-runner": "tenant_runner"}  # fmt: skip
# Recorded series the traffic above must have produced (tenant classify requests included).
RECORDED = [
    "runner_name:bentoml_service_request:rate5m",
    "runner_name:bentoml_service_request_duration_seconds:p99_rate5m",
    "runner_model:bundle_padding_efficiency:mean_rate5m",
    "job:bundle_tenant_cache_hits:ratio_rate5m",
]


def test_prometheus_scrapes_every_service_and_its_rules_evaluate(stack) -> None:
    """After the Locust run: a series for every service's requests, every target up, every
    recording rule healthy and the main ones holding values."""
    _, env = stack
    prometheus = httpx.Client(base_url=f"http://127.0.0.1:{env['PROMETHEUS_PORT']}", timeout=10)

    def query(expr: str) -> list[dict]:
        reply = prometheus.get("/api/v1/query", params={"query": expr})
        assert reply.status_code == 200, reply.text
        return reply.json()["data"]["result"]

    deadline = time.monotonic() + 90  # a few scrape and evaluation rounds (5 s each)
    while True:
        missing = [
            job for job in JOBS if not query(f'bentoml_service_request_total{{job="{job}"}}')
        ] + [name for name in RECORDED if not query(name)]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(5)
    assert not missing, missing
    served = {r["metric"]["runner_name"] for r in query(RECORDED[0])}
    assert set(JOBS.values()) <= served, served
    targets = prometheus.get("/api/v1/targets").json()["data"]["activeTargets"]
    assert {t["labels"]["job"] for t in targets if t["health"] == "up"} >= set(JOBS)
    groups = prometheus.get("/api/v1/rules").json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == 19 and all(rule["health"] == "ok" for rule in rules), rules


def test_a_restarted_runner_serves_again(stack) -> None:
    client, env = stack
    before = client.post("/embed", json={"texts": PAIR}).json()["embeddings"]
    compose("restart", "onnx-runner", env=env)
    recovered_in = wait_serving(client)
    after = client.post("/embed", json={"texts": PAIR}).json()["embeddings"]
    assert np.allclose(before, after, atol=1e-5)
    print(f"served again {recovered_in:.1f} s after the restart returned")


def test_tenant_models_survive_recreating_the_runner(stack) -> None:
    client, env = stack
    spec = demo.tenant(7)  # trained above
    version = client.post("/classify", json={"tenant": spec.name, "texts": ["hi"]}).json()
    compose("up", "-d", "--force-recreate", "--no-deps", "tenant-runner", env=env)
    deadline = time.monotonic() + 240
    while True:
        reply = client.post("/classify", json={"tenant": spec.name, "texts": ["hi"]})
        if reply.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert reply.status_code == 200, reply.text
    assert reply.json()["version"] == version["version"]
