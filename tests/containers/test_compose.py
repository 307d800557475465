"""The compose stack from real images (`make test-containers`): smoke, each ONNX model in its own
container, a headless Locust run with 0 failures, Prometheus scraping every replica and the proxy
with its rules evaluating, a runner restarted and the stack serving again, tenant models kept
across re-creation, requests answered across a runner scaled to zero and back. The stack itself
is started once for the container tests (conftest.py)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import yaml

from models import demo_tenants as demo
from serving.tallies import FLUSH_S
from testkit.processes import ROOT
from tests.containers.conftest import COMPOSE_FILES, Stack, wait_serving
from tests.load.test_locust_smoke import run_locust

PAIR = ["A man is eating food.", "A man is eating a piece of bread."]
TENANT_RUNNERS = ["tenant-runner-1", "tenant-runner-2", "tenant-runner-3"]


def test_only_the_front_door_and_prometheus_are_published(stack: Stack) -> None:
    env = stack.env
    ports = stack.compose("ps")
    assert f"127.0.0.1:{env['TOKENIZER_PORT']}->8080/tcp" in ports
    assert f"127.0.0.1:{env['PROMETHEUS_PORT']}->9090/tcp" in ports
    assert ports.count("->") == 2, ports


def test_smoke_embed_similarity_tokenize(stack: Stack) -> None:
    client = stack.client
    for backend in ("onnx", "onnx-int8", "tf"):
        reply = client.post("/embed", json={"texts": PAIR, "backend": backend})
        assert reply.status_code == 200, reply.text
        vectors = np.array(reply.json()["embeddings"])
        assert vectors.shape == (2, 384)
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-3)
    scores = client.post("/similarity", json={"pairs": [PAIR], "threshold": 0.5}).json()
    assert abs(scores["scores"][0] - 0.755) < 0.01 and scores["labels"] == [1]
    ids = client.post(
        "/tokenize", json={"texts": ["hello world"], "model": "all-MiniLM-L6-v2"}
    ).json()
    assert ids["ids"] == [[101, 7592, 2088, 102]]


# One container per ONNX model (deploy/compose/docker-compose.yml): each service and its model.
MODEL_SERVICES = {
    "onnx-runner": "all-MiniLM-L6-v2",
    "onnx-runner-intent-classifier": "intent-classifier",
    "onnx-runner-intent-reranker": "intent-reranker",
}


def test_each_onnx_model_is_served_by_its_own_container(stack: Stack) -> None:
    """/predict and /rerank answer as the README says, through the heads' own services: each one's
    engine-call counter moved with these requests (the proxy sent each call by its model,
    X-Bundle-Model, to the service named for it). And each service has loaded its own model only
    (its BUNDLE_ONNX_MODELS): the models its counters name."""
    before = stack.inside({"batches": list(MODEL_SERVICES)})
    predicted = stack.client.post(
        "/predict", json={"inputs": ["I forgot my password", "where is my order"]}
    )
    assert predicted.status_code == 200, predicted.text
    best = [labels[0]["label"] for labels in predicted.json()["predictions"]]
    assert best == ["reset_password", "order_status"]
    ranked = stack.client.post(
        "/rerank",
        json={"query": "I forgot my password",
              "texts": ["where is my order", "reset my password please"]},
    )  # fmt: skip
    assert ranked.status_code == 200, ranked.text
    assert [r["index"] for r in ranked.json()] == [1, 0]
    heads = ("onnx-runner-intent-classifier", "onnx-runner-intent-reranker")  # 1 replica each

    def moved(now: dict) -> bool:
        return all(sum(now[h].values()) > sum(before[h].values()) for h in heads)

    deadline = time.monotonic() + 10  # a runner's tallies reach its /metrics every FLUSH_S
    while not moved(after := stack.inside({"batches": list(MODEL_SERVICES)})):
        assert time.monotonic() < deadline, (before, after)
        time.sleep(FLUSH_S)
    for service, model in MODEL_SERVICES.items():
        assert after[service] and {label.split("/")[0] for label in after[service]} == {model}, (
            service, after[service],
        )  # fmt: skip


def test_train_and_classify_a_tenant(stack: Stack) -> None:
    client = stack.client
    spec = demo.tenant(7)
    examples = [{"text": t, "intent": i} for t, i in spec.train]
    trained = client.post("/tenants/train", json={"tenant": spec.name, "examples": examples})
    assert trained.status_code == 200, trained.text
    text, intent = spec.train[0]
    reply = client.post("/classify", json={"tenant": spec.name, "texts": [text]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["intents"] == [intent]


def test_headless_locust_has_no_failures(stack: Stack) -> None:
    client = stack.client
    proc, total = run_locust(
        str(client.base_url).rstrip("/"), "ChatUser", 8, 15, ROOT / "build" / "locust" / "compose"
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert int(total["Request Count"]) > 50 and int(total["Failure Count"]) == 0


# Scrape job → the service name BentoML labels its series with. Replicas are targets of one job.
JOBS = {"tokenizer": "tokenizer", "onnx-runner": "onnx_runner", "tf-runner": "tf_runner",
        "tenant-runner": "tenant_runner"}  # fmt: skip
# The onnx-runner job: MiniLM's two replicas and the heads' one each (one container per model).
REPLICAS = {"tokenizer": 2, "onnx-runner": 4, "tf-runner": 1, "tenant-runner": 3, "proxy": 1}
# Recorded series the traffic above must have produced (tenant classify requests included).
RECORDED = [
    "runner_name:bentoml_service_request:rate5m",
    "runner_name:bentoml_service_request_duration_seconds:p99_rate5m",
    "runner_model:bundle_padding_efficiency:mean_rate5m",
    "job:bundle_tenant_cache_hits:ratio_rate5m",
]


def test_prometheus_scrapes_every_replica_and_its_rules_evaluate(stack: Stack) -> None:
    """After the Locust run: a series for every service's requests, every replica a target that
    is up (the proxy too, with its servers), every recording rule healthy and the main ones
    holding values."""
    env = stack.env
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
    up = [t["labels"]["job"] for t in targets if t["health"] == "up"]
    assert {job: up.count(job) for job in REPLICAS} == REPLICAS, targets
    servers = query('haproxy_backend_active_servers{proxy="tenant-runners"}')
    assert [float(r["value"][1]) for r in servers] == [3.0], servers
    groups = prometheus.get("/api/v1/rules").json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == 19 and all(rule["health"] == "ok" for rule in rules), rules


def test_a_restarted_runner_serves_again(stack: Stack) -> None:
    client = stack.client
    before = client.post("/embed", json={"texts": PAIR}).json()["embeddings"]
    stack.compose("restart", "onnx-runner")
    recovered_in = wait_serving(client)
    after = client.post("/embed", json={"texts": PAIR}).json()["embeddings"]
    assert np.allclose(before, after, atol=1e-5)
    print(f"served again {recovered_in:.1f} s after the restart returned")


def test_tenant_models_survive_recreating_the_runners(stack: Stack) -> None:
    client = stack.client
    spec = demo.tenant(7)  # trained above
    version = client.post("/classify", json={"tenant": spec.name, "texts": ["hi"]}).json()
    stack.compose("up", "-d", "--force-recreate", "--no-deps", *TENANT_RUNNERS)
    deadline = time.monotonic() + 240
    while True:
        reply = client.post("/classify", json={"tenant": spec.name, "texts": ["hi"]})
        if reply.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert reply.status_code == 200, reply.text
    assert reply.json()["version"] == version["version"]


COMPOSE = COMPOSE_FILES[0]
WAITING = 8  # requests sent while MiniLM's ONNX runner has no replica


def test_requests_to_a_runner_scaled_to_zero_wait_and_are_answered_once_it_is_up(
    stack: Stack,
) -> None:
    """Scale to zero on compose (deploy/README.md): MiniLM's `onnx-runner` scaled to 0 with the
    documented command, requests sent through the front door while the proxy has no replica of
    it, then scaled to 1: none refused, every answer the one from before. They wait in the
    tokenizer (BUNDLE_TOKENIZER_REPLICA_WAIT_S in the compose file), which is what must cover the
    new replica's cold start. Scaled back to 2 after, as the other tests found it."""
    spec = yaml.safe_load(COMPOSE.read_text())["services"]["tokenizer"]["environment"]
    wait_s = float(spec["BUNDLE_TOKENIZER_REPLICA_WAIT_S"])
    before = np.array(stack.client.post("/embed", json={"texts": PAIR}).json()["embeddings"])
    url = f"{stack.client.base_url}".rstrip("/") + "/embed"

    def scale(replicas: int) -> None:
        stack.compose("up", "-d", "--no-deps", "--scale", f"onnx-runner={replicas}", "onnx-runner")

    def active() -> float:
        return stack.inside({"active": "onnx-runners"})["active"]

    def until(replicas: float, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while active() != replicas:
            assert time.monotonic() < deadline, f"the proxy did not see {replicas} replicas"
            time.sleep(0.5)

    def one(_: int) -> tuple[httpx.Response, float]:
        reply = httpx.post(url, json={"texts": PAIR}, timeout=wait_s + 60)
        return reply, time.monotonic()

    try:
        scale(0)
        until(0, 60)
        with ThreadPoolExecutor(WAITING) as pool:
            futures = [pool.submit(one, i) for i in range(WAITING)]
            time.sleep(2)
            assert not [f.result()[0].text for f in futures if f.done()]  # none refused: waiting
            scaled = time.monotonic()
            scale(1)  # one replica starting on the host's two cores, as on Swarm
            answers = [f.result() for f in futures]
    finally:
        scale(2)
        until(2, 180)
    for reply, _ in answers:
        assert reply.status_code == 200, reply.text
        assert np.allclose(np.array(reply.json()["embeddings"]), before, atol=1e-4)
    took = sorted(answered - scaled for _, answered in answers)
    print(
        f"answered {took[0]:.1f}-{took[-1]:.1f} s after the scale-up began (wait: {wait_s:.0f} s)"
    )
