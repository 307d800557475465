"""The compose file on Docker Swarm (`make test-swarm`): a one-node swarm on the engine, the stack
deployed with `docker stack deploy`, smoke through the proxy from a client container on the stack's
network, a replica's container killed under load (Swarm replaces it; nothing fails beyond the
requests in flight at the kill, nothing answers wrong), a rolling update of the tokenizer image
under load with no failed request. Then the stack removed, the swarm left, and everything it
created removed and checked gone: the client containers by their IDs, the stack's by `docker
stack rm` and then checked gone by its label.

Swarm's virtual IPs do not route on this machine: the services use endpoint_mode dnsrr and the
proxy resolves replicas itself (deploy/README.md). Nothing is published: the client container
joins the stack's attachable network. Needs a Docker engine that is in no swarm (or in one an
earlier, killed run of this test left, which it takes down first), and the images (`make
test-swarm` provides both and stops the engine it started).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from models import demo_tenants as demo
from serving.startup import parse
from testkit.containers import docker
from testkit.haproxy_ring import Ring
from testkit.processes import ROOT

COMPOSE = ROOT / "deploy" / "compose" / "docker-compose.yml"
LOAD = Path(__file__).with_name("load.py")
LOGS = ROOT / "build" / "test-logs"
PAIR = ["A man is eating food.", "A man is eating a piece of bread."]
THREADS = 4  # the load's clients: at most this many requests are in flight at any moment
TENANT = demo.tenant(7)
STACK_PREFIX = "bundle-swarm-"  # every stack this test deploys: bundle-swarm-<6 hex>
STACK_NAME = re.compile(rf"{STACK_PREFIX}[0-9a-f]{{6}}")
STORE_LABEL = "bento-bundle.tenant-store"  # the node label the compose file's placement reads
# Set on the node beside STORE_LABEL (which users set on their own nodes too, deploy/README.md):
# marks a swarm as this test's even before its stack is deployed.
TEST_LABEL = "bento-bundle.swarm-test"

# Trains a tenant through the front door (once the stack answers), then asks each endpoint once:
# the answers every request under load is compared with.
REFERENCE = """
import json, sys, time
import httpx
spec = json.loads(sys.argv[1])
http = httpx.Client(base_url=spec["url"], timeout=30)
deadline = time.monotonic() + spec["wait_s"]
while True:
    try:
        if http.post("/embed", json={"texts": ["ready?"]}).status_code == 200:
            break
    except httpx.TransportError:
        pass
    assert time.monotonic() < deadline, "the stack did not serve in time"
    time.sleep(2)
ready_s = spec["wait_s"] - (deadline - time.monotonic())
trained = http.post("/tenants/train", json={"tenant": spec["tenant"], "examples": spec["examples"]})
assert trained.status_code == 200, trained.text
ref = {"embed_texts": spec["pair"], "classify_texts": spec["classify"], "pairs": [spec["pair"]]}
ref["embeddings"] = http.post("/embed", json={"texts": spec["pair"]}).json()["embeddings"]
ref["intents"] = http.post("/classify", json={"tenant": spec["tenant"], "texts": spec["classify"]}).json()["intents"]
ref["scores"] = http.post("/similarity", json={"pairs": [spec["pair"]]}).json()["scores"]
# the demo heads, each on its own runner service
ref["predicted"] = [labels[0]["label"] for labels in http.post("/predict", json={"inputs": spec["predict"]}).json()["predictions"]]
ref["ranked"] = [r["index"] for r in http.post("/rerank", json=spec["rerank"]).json()]
print(json.dumps({"reference": ref, "ready_s": ready_s}))
"""

# Sends REQUESTS /embed requests at once once the proxy has no ONNX runner replica up (its
# /healthz, :8404, answers 503 while a runner backend has none), prints "waiting", then waits for
# every answer: each one's status, the wall-clock times it was sent and answered (a container shares
# the host's clock), and whether it equals the reference.
WAITERS = """
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
import httpx
spec = json.loads(sys.argv[1])
deadline = time.monotonic() + 60
while httpx.get("http://proxy:8404/healthz", timeout=5).status_code != 503:
    assert time.monotonic() < deadline, "the proxy still has a runner replica up"
    time.sleep(0.5)
def one(i):
    with httpx.Client(base_url=spec["url"], timeout=120) as http:
        sent = time.time()
        reply = http.post("/embed", json={"texts": spec["texts"]})
        answered = time.time()
    got = reply.json().get("embeddings", []) if reply.status_code == 200 else []
    right = [len(v) for v in got] == [len(v) for v in spec["embeddings"]] and all(
        abs(a - b) < 1e-4 for g, w in zip(got, spec["embeddings"]) for a, b in zip(g, w))
    return {"status": reply.status_code, "sent": sent, "answered": answered, "right": right,
            "body": "" if right else reply.text[:300]}
with ThreadPoolExecutor(spec["requests"]) as pool:
    futures = [pool.submit(one, i) for i in range(spec["requests"])]
    time.sleep(1)
    print("waiting", flush=True)
    print(json.dumps([f.result() for f in futures]))
"""
REQUESTS = 16  # requests waiting while the ONNX runner has no replica
# From the new replica ready (its own bundle-startup line) to every waiting request answered: the
# proxy resolving its name (1 s) and checking it up (2 checks 2 s apart), the tokenizer's next try
# (0.5 s apart), the call itself, a loaded host.
READY_TO_ANSWERED_S = 10.0


@dataclass
class Swarm:
    stack: str
    tag: str
    clients: list[str] = field(default_factory=list)  # IDs of the client containers started
    reference: dict = field(default_factory=dict)

    @property
    def network(self) -> str:
        return f"{self.stack}_internal"

    def start_client(self, script: str, spec: dict) -> str:
        """A client container on the stack's network running ``script``; its ID."""
        cid = docker(
            "run", "-d", "--network", self.network, "--entrypoint", "python",
            f"bento-bundle/tokenizer:{self.tag}", "-c", script, json.dumps(spec),
        )  # fmt: skip
        self.clients.append(cid)
        return cid

    def finish_client(self, cid: str, timeout: float = 600) -> dict:
        """Waits for the client to exit (SIGTERM first to stop a load early), its JSON result."""
        status = docker("wait", cid, timeout=timeout)
        out = docker("logs", cid)
        docker("rm", cid)
        self.clients.remove(cid)
        assert status == "0", f"client exited {status}: {out[-2000:]}"
        return json.loads(out.splitlines()[-1])

    def containers(self, service: str) -> list[str]:
        return docker(
            "ps", "-q", "--filter", f"label=com.docker.swarm.service.name={self.stack}_{service}"
        ).split()

    def unconverged(self) -> list[str]:
        """Services with fewer replicas running than desired, as "name running/desired"."""
        rows = docker("stack", "services", self.stack, "--format", "{{.Name}} {{.Replicas}}")
        return [row for row in rows.splitlines() if len(set(row.split()[1].split("/"))) != 1]

    def replicas(self, service: str) -> tuple[int, int]:
        # `service ls --filter name=` matches a prefix (onnx-runner would match
        # onnx-runner-intent-classifier too): the row of the exact name is taken.
        rows = docker(
            "service", "ls", "--filter", f"name={self.stack}_{service}",
            "--format", "{{.Name}} {{.Replicas}}",
        )  # fmt: skip
        (replicas,) = [
            r.split()[1] for r in rows.splitlines() if r.split()[0] == f"{self.stack}_{service}"
        ]
        running, desired = replicas.split("/")
        return int(running), int(desired)


def leftovers(stack: str) -> dict[str, str]:
    label = f"label=com.docker.stack.namespace={stack}"
    found = {
        "containers": docker("ps", "-aq", "--filter", label),
        "networks": docker("network", "ls", "-q", "--filter", label),
        "volumes": docker("volume", "ls", "-q", "--filter", f"name={stack}_"),
        "swarm": docker("info", "--format", "{{.Swarm.LocalNodeState}}").replace("inactive", ""),
        "docker_gwbridge": docker("network", "ls", "-q", "--filter", "name=^docker_gwbridge$"),
    }
    return {what: ids for what, ids in found.items() if ids}


def save_logs(stack: str) -> None:
    """Every container of the stack's log, to build/test-logs/swarm.log (`docker service logs`
    can hang on a task that is gone; a container's own log does not)."""
    LOGS.mkdir(parents=True, exist_ok=True)
    label = f"label=com.docker.stack.namespace={stack}"
    with open(LOGS / "swarm.log", "w") as log:
        for cid in docker("ps", "-aq", "--filter", label, check=False).split():
            try:
                name = docker("inspect", "--format", "{{.Name}}", cid, check=False, timeout=30)
                out = subprocess.run(
                    ["/usr/bin/docker", "logs", cid], capture_output=True, text=True, timeout=30
                )
                log.write(f"===== {name} =====\n{out.stdout}{out.stderr}")
            except subprocess.TimeoutExpired:
                log.write(f"===== {cid}: no log within 30 s =====\n")


def proxy_log(swarm: Swarm) -> str:
    """The proxy's log: only failed, retried and redispatched requests (deploy/README.md), each
    with HAProxy's termination state, so a failed request under load says which side closed what."""
    return "\n".join(
        docker("logs", "--tail", "50", cid, check=False) for cid in swarm.containers("proxy")
    )


def load(swarm: Swarm, seconds: float) -> str:
    return swarm.start_client(
        LOAD.read_text(),
        {"url": "http://proxy:8080", "threads": THREADS, "seconds": seconds,
         "tenant": TENANT.name, "reference": swarm.reference},
    )  # fmt: skip


def left_behind() -> list[str] | None:
    """The stacks of a swarm that an earlier run of this test made and never left, or None where
    the engine's swarm is not one of those.

    A run killed before its teardown (a CI job stopped mid-test) leaves the engine in its swarm,
    and the engine's data root keeps the swarm across restarts (`make test-swarm` starts dockerd
    on the same data root each time): the next run finds a swarm, and dockerd has started the old
    stack again. Such a swarm is recognised by what this test makes: one node, a manager, with
    the tenant-store label; stacks all named ``bundle-swarm-<6 hex>`` and no service outside
    them; and at least one such stack or the test's own node label (runs before that label
    existed are recognised by their stack). A swarm a user made does not look like that."""
    if docker("info", "--format", "{{.Swarm.ControlAvailable}}") != "true":
        return None  # a worker node: not a swarm this test made
    # An engine that has just started on such a data root elects its one manager first: until
    # then the node commands fail ("the swarm does not have a leader").
    deadline = time.monotonic() + 60
    while (nodes := docker("node", "ls", "-q", check=False).split()) == []:
        assert time.monotonic() < deadline, "the swarm this engine is in has no manager answering"
        time.sleep(2)
    labels = json.loads(docker("node", "inspect", "self", "--format", "{{json .Spec.Labels}}"))
    stacks = docker("stack", "ls", "--format", "{{.Name}}").split()
    services = docker("service", "ls", "--format", "{{.Name}}").split()
    ours = len(nodes) == 1 and (labels or {}).get(STORE_LABEL) == "true"
    ours = ours and all(STACK_NAME.fullmatch(name) for name in stacks)
    ours = ours and all(any(s.startswith(f"{st}_") for st in stacks) for s in services)
    ours = ours and (bool(stacks) or (labels or {}).get(TEST_LABEL) == "true")
    return stacks if ours else None


def remove_stack(stack: str, clients: list[str]) -> None:
    """Remove the stack and its client containers, and wait for the stack's containers to go."""
    save_logs(stack)
    for cid in list(clients):
        docker("rm", "-f", cid, check=False)
    docker("stack", "rm", stack, check=False)
    deadline = time.monotonic() + 120  # the tasks stop, then their networks can go
    label = f"label=com.docker.stack.namespace={stack}"
    while docker("ps", "-aq", "--filter", label) and time.monotonic() < deadline:
        time.sleep(2)


def leave_swarm(had_gwbridge: bool) -> None:
    """The engine leaves the swarm (its tasks' containers go with it), and Swarm's gateway bridge
    goes unless it was there before."""
    docker("swarm", "leave", "--force", check=False)
    if not had_gwbridge:
        docker("network", "rm", "docker_gwbridge", check=False)


def forget(stack: str) -> None:
    """Once the swarm is left: the stack's volumes (no task holds them now) and the rollout's
    image tag."""
    for volume in docker("volume", "ls", "-q", "--filter", f"name={stack}_").split():
        docker("volume", "rm", volume, check=False)
    docker("image", "rm", f"bento-bundle/tokenizer:rollout-{stack}", check=False)


def take_down_left_behind() -> None:
    """Where the engine is in a swarm an earlier run of this test left (``left_behind``), its
    stacks, their client containers (on the stack's network, not labelled) and the swarm go, as
    that run's teardown would have taken them."""
    deadline = time.monotonic() + 60  # an engine just restarted in a swarm rejoins it first
    while (state := docker("info", "--format", "{{.Swarm.LocalNodeState}}")) == "pending":
        if time.monotonic() > deadline:
            break
        time.sleep(2)
    if state != "active":
        return
    stacks = left_behind()
    if stacks is None:
        return  # not ours: the fixture says so
    print(f"taking down the swarm an earlier run left, stacks: {stacks}")
    try:
        for stack in stacks:
            network = f"network={stack}_internal"
            remove_stack(stack, docker("ps", "-aq", "--filter", network, check=False).split())
    finally:
        leave_swarm(had_gwbridge=False)
        # A run killed in its own teardown, its stack removed and the swarm not yet left, also
        # left its stack's volumes and rollout tag: they are this test's by their names.
        volumes = docker("volume", "ls", "-q", "--filter", f"name={STACK_PREFIX}").split()
        tags = docker("image", "ls", "--format", "{{.Tag}}", "bento-bundle/tokenizer").split()
        named = {m.group(0) for name in volumes + tags if (m := STACK_NAME.search(name))}
        for stack in set(stacks) | named:
            forget(stack)
    for stack in stacks:
        assert not leftovers(stack), leftovers(stack)


@pytest.fixture(scope="module")
def swarm() -> Iterator[Swarm]:
    take_down_left_behind()
    state = docker("info", "--format", "{{.Swarm.LocalNodeState}}")
    assert state == "inactive", (
        f"this engine's swarm state is {state!r}, and it is not a swarm an earlier run of this"
        " test left: the test makes a swarm of its own and leaves it after, so it needs an engine"
        " in no swarm (`docker swarm leave --force` where this one is not needed)"
    )
    swarm = Swarm(f"{STACK_PREFIX}{uuid.uuid4().hex[:6]}", os.environ.get("IMAGE_TAG", "latest"))
    had_gwbridge = bool(docker("network", "ls", "-q", "--filter", "name=^docker_gwbridge$"))
    # Swarm's control port on loopback only: this one node is the whole swarm.
    docker("swarm", "init", "--advertise-addr", "127.0.0.1", "--listen-addr", "127.0.0.1:2377")
    try:
        # The node that holds the tenant store (the compose file's placement constraint).
        node = docker("info", "--format", "{{.Swarm.NodeID}}")
        docker(
            "node", "update", "--label-add", f"{STORE_LABEL}=true",
            "--label-add", f"{TEST_LABEL}=true", node,
        )  # fmt: skip
        started = time.monotonic()
        docker(
            "stack", "deploy", "--compose-file", str(COMPOSE), swarm.stack,
            env={"IMAGE_TAG": swarm.tag, "ADMIN_ENABLED": "true"},  # the compose file reads them
        )  # fmt: skip
        examples = [{"text": t, "intent": i} for t, i in TENANT.train]
        cid = swarm.start_client(
            REFERENCE,
            {"url": "http://proxy:8080", "wait_s": 240, "tenant": TENANT.name,
             "examples": examples, "pair": PAIR, "classify": [TENANT.train[0][0]],
             "predict": ["I forgot my password", "where is my order"],
             "rerank": {"query": "I forgot my password",
                        "texts": ["where is my order", "reset my password please"]}},
        )  # fmt: skip
        answer = swarm.finish_client(cid)
        swarm.reference = answer["reference"]
        # Serving needs one replica of each; the tests need them all. (A tokenizer that started
        # before the runners answered exited, and Swarm is starting it again.)
        deadline = time.monotonic() + 240
        while pending := swarm.unconverged():
            assert time.monotonic() < deadline, f"not all replicas running: {pending}"
            time.sleep(2)
        print(f"stack deployed and serving in {time.monotonic() - started:.0f} s")
        yield swarm
    finally:
        try:
            remove_stack(swarm.stack, swarm.clients)
        finally:  # whatever failed above, the engine leaves the swarm
            leave_swarm(had_gwbridge)
            forget(swarm.stack)
        found = leftovers(swarm.stack)
        if had_gwbridge:
            found.pop("docker_gwbridge", None)
        assert not found, found


def test_smoke_embed_similarity_classify_predict_rerank(swarm: Swarm) -> None:
    ref = swarm.reference
    vectors = np.array(ref["embeddings"])
    assert vectors.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-3)
    assert abs(ref["scores"][0] - 0.755) < 0.01
    assert ref["intents"] == [TENANT.train[0][1]]
    assert swarm.replicas("tokenizer") == (2, 2) and swarm.replicas("onnx-runner") == (2, 2)
    # One ONNX runner service per model: the heads answer from theirs as the README says.
    assert ref["predicted"] == ["reset_password", "order_status"] and ref["ranked"] == [1, 0]
    for service in ("onnx-runner-intent-classifier", "onnx-runner-intent-reranker"):
        assert swarm.replicas(service) == (1, 1), service


def test_killed_replicas_are_replaced_and_nothing_answers_wrong(swarm: Swarm) -> None:
    """One of the ONNX runner's two replicas and the tenant runner that holds the load's tenant
    (the one the proxy's ring names), SIGKILLed under load: the proxy sends their requests to the
    others (the tenant is loaded on another replica), Swarm starts new containers."""
    home = f"tenant-runner-{Ring([1, 2, 3], weight=16).server(TENANT.name)}"
    killed = [swarm.containers("onnx-runner")[0], swarm.containers(home)[0]]
    cid = load(swarm, seconds=40)
    time.sleep(10)
    docker("kill", *killed)
    result = swarm.finish_client(cid)
    print(f"{result['requests']} requests, {len(result['failed'])} failed: {result['failed']}")
    assert result["wrong"] == [], result["wrong"]
    # Only requests in flight at the kill may fail: THREADS clients, so at most THREADS of them.
    assert len(result["failed"]) <= THREADS, (result["failed"], proxy_log(swarm))
    assert result["ok"] > 100, result
    deadline = time.monotonic() + 180
    while (swarm.replicas("onnx-runner"), swarm.replicas(home)) != ((2, 2), (1, 1)):
        assert time.monotonic() < deadline, "Swarm did not replace the killed replicas"
        time.sleep(2)
    replaced = swarm.containers("onnx-runner") + swarm.containers(home)
    assert len(replaced) == 3 and not set(killed) & set(replaced)


def test_rolling_update_of_the_tokenizer_under_load_fails_nothing(swarm: Swarm) -> None:
    """A new tokenizer image rolled out one replica at a time, the new one started first."""
    new = f"bento-bundle/tokenizer:rollout-{swarm.stack}"
    docker("tag", f"bento-bundle/tokenizer:{swarm.tag}", new)
    before = set(swarm.containers("tokenizer"))
    cid = load(swarm, seconds=500)
    time.sleep(5)
    started = time.monotonic()
    docker("service", "update", "--detach=false", "--image", new, f"{swarm.stack}_tokenizer")
    took = time.monotonic() - started
    time.sleep(5)
    docker("kill", "--signal", "TERM", cid)
    result = swarm.finish_client(cid)
    print(
        f"rolled out in {took:.0f} s; {result['requests']} requests, replicas {result['replicas']}"
    )
    assert result["failed"] == [] and result["wrong"] == [], (result, proxy_log(swarm))
    assert result["ok"] > 100, result
    spec = docker("service", "inspect", "--format", "{{.Spec.TaskTemplate.ContainerSpec.Image}}",
                  f"{swarm.stack}_tokenizer")  # fmt: skip
    assert spec.startswith(new), spec
    after = set(swarm.containers("tokenizer"))
    assert len(after) == 2 and not before & after  # both replicas replaced


def test_requests_to_a_runner_scaled_to_zero_wait_and_are_answered_once_it_is_up(
    swarm: Swarm,
) -> None:
    """The ONNX runner scaled to 0, requests sent, then scaled to 1: none refused, every answer
    right, each within the new replica's cold start (measured here: the scale-up to the ready its
    log records) plus READY_TO_ANSWERED_S (services/tokenizer/replica_wait.py holds them). The
    runner is scaled back to 2 after."""
    service = f"{swarm.stack}_onnx-runner"
    try:
        docker("service", "scale", "--detach=false", f"{service}=0", timeout=180)
        cid = swarm.start_client(
            WAITERS,
            {"url": "http://proxy:8080", "requests": REQUESTS, "texts": PAIR,
             "embeddings": swarm.reference["embeddings"]},
        )  # fmt: skip
        deadline = time.monotonic() + 90
        while "waiting" not in docker("logs", cid):
            assert time.monotonic() < deadline, docker("logs", cid)
            time.sleep(0.5)
        time.sleep(2)  # the requests wait on: none is refused while no replica is up
        scaled = time.time()
        docker("service", "scale", "--detach=true", f"{service}=1")
        answers = swarm.finish_client(cid, timeout=300)
        (replica,) = swarm.containers("onnx-runner")
        started = docker("inspect", "--format", "{{.State.StartedAt}}", replica)
        # Each worker logs its start; the replica is ready with the last of them.
        logged = [r for r in parse(docker("logs", replica)) if r["service"] == "onnx_runner"]
        ready = max(logged, key=lambda r: r["ready_at"])
    finally:
        docker("service", "scale", "--detach=false", f"{service}=2", timeout=300)
    assert [a["status"] for a in answers] == [200] * REQUESTS, answers
    assert all(a["right"] for a in answers), answers
    assert all(a["sent"] < scaled for a in answers)  # each sent while no replica was up
    container_s = dt.datetime.fromisoformat(started).timestamp() - scaled
    ready_s = ready["ready_at"] - scaled
    after = [a["answered"] - scaled for a in answers]
    print(
        f"after the scale-up: container started {container_s:.1f} s, runner ready {ready_s:.1f} s "
        f"(import {ready['import_s']:.1f}, load {ready['load_s']:.1f}, warm-up "
        f"{ready['warm_up_s']:.1f} s), requests answered {min(after):.1f}-{max(after):.1f} s; "
        f"each waited {min(a['answered'] - a['sent'] for a in answers):.1f}-"
        f"{max(a['answered'] - a['sent'] for a in answers):.1f} s"
    )
    assert max(after) <= ready_s + READY_TO_ANSWERED_S, (after, ready_s)
