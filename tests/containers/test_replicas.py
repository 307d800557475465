"""Tenant-runner replicas behind the proxy (`make test-containers`): each tenant is answered by one
replica, the one the hash ring names (testkit/haproxy_ring.py, the model the simulation uses); the
replicas together load each tenant once, not once per replica; a stopped replica's tenants are
answered by the others within seconds, with the same answers, and nobody else's tenant moves; the
replica back, its tenants return to it."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from models import demo_tenants as demo
from testkit.haproxy_ring import Ring
from tests.containers.conftest import Stack

REPLICAS = ["tenant-runner-1", "tenant-runner-2", "tenant-runner-3"]  # server ids 1, 2, 3
# None of the other tests' tenants; the ring puts 5, 7 and 3 of these 15 on tenant-runner-1, -2
# and -3 (more only train longer).
TENANTS = [demo.tenant(index) for index in range(100, 115)]
PUBLIC = {spec.name for spec in TENANTS[:10]}  # asked through the public door first
STOPPED = "tenant-runner-2"
FAILOVER_S = 10


def replica_of(server_id: int) -> str:
    return REPLICAS[server_id - 1]


def all_replicas_up(stack: Stack) -> None:
    """Every tenant runner up at the proxy: other tests recreate and restart them, and a call sent
    to one still starting waits for it (a training queued there runs past its timeout)."""
    deadline = time.monotonic() + 60
    while stack.inside({"active": "tenant-runners"})["active"] < len(REPLICAS):
        assert time.monotonic() < deadline, "the proxy does not see three tenant runners up"
        time.sleep(2)


@pytest.fixture(scope="module")
def tenants(stack: Stack) -> list[list]:
    """15 demo tenants trained through the public API as ONNX models; [name, SentencePiece ids of
    a phrase]."""
    all_replicas_up(stack)

    def train(spec: demo.DemoTenant) -> None:
        examples = [{"text": text, "intent": intent} for text, intent in spec.train]
        # Whole models (ONNX): what a replica loads on demand under its budget. (Head tenants are
        # read by any replica in ~0.3 ms; placement matters for the models that cost memory.)
        body = {"tenant": spec.name, "examples": examples, "format": "onnx"}
        reply = stack.client.post("/tenants/train", json=body)
        assert reply.status_code == 200, reply.text

    # Two at a time, the machine's cores: training is CPU-bound, and more at once only wait longer
    # each, up to the public service's request timeout on a busy host.
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(train, TENANTS))
    texts = [spec.train[0][0] for spec in TENANTS]
    reply = stack.client.post("/tokenize", json={"texts": texts, "tokenizer": "sentencepiece"})
    assert reply.status_code == 200, reply.text
    return [[spec.name, [ids]] for spec, ids in zip(TENANTS, reply.json()["ids"], strict=True)]


@pytest.fixture(scope="module")
def placed(stack: Stack, tenants: list[list]) -> dict[str, dict]:
    """Ten tenants asked through the public door (tokenizer → proxy), then every tenant asked 3
    times through the proxy directly; what answered, with every replica's cache figures before
    and after."""
    all_replicas_up(stack)
    before = stack.inside({"stats": REPLICAS})
    for spec in TENANTS[:10]:
        reply = stack.client.post("/classify", json={"tenant": spec.name, "texts": ["hello"]})
        assert reply.status_code == 200 and reply.json()["cache"] == "miss", reply.text
    answers = stack.inside({"classify": tenants, "times": 3})
    after = stack.inside({"stats": REPLICAS})
    return {"answers": answers, "before": before, "after": after}


def test_each_tenant_is_answered_by_the_replica_the_ring_names(placed: dict) -> None:
    ring = Ring([1, 2, 3], weight=16)  # haproxy.cfg: ids 1-3, weight 16
    for spec in TENANTS:
        answers = placed["answers"][spec.name]
        assert [a["status"] for a in answers] == [200] * 3, answers
        assert {a["replica"] for a in answers} == {replica_of(ring.server(spec.name))}, answers
        # Loaded once on that replica: by the public request (then three hits), or by the first.
        expected = ["hit"] * 3 if spec.name in PUBLIC else ["miss", "hit", "hit"]
        assert [a["cache"] for a in answers] == expected, (spec.name, answers)
    spread = {
        r: sum(placed["answers"][s.name][0]["replica"] == r for s in TENANTS) for r in REPLICAS
    }
    print(f"tenants per replica: {spread}")
    assert all(count > 0 for count in spread.values()), spread


def test_the_replicas_load_each_tenant_once_not_once_each(placed: dict) -> None:
    loaded = {r: placed["after"][r]["loaded"] - placed["before"][r]["loaded"] for r in REPLICAS}
    loads = {r: placed["after"][r]["loads"] - placed["before"][r]["loads"] for r in REPLICAS}
    print(f"models loaded per replica: {loaded}")
    assert sum(loaded.values()) == len(TENANTS), loaded  # not 3 x 15: each tenant on one replica
    assert sum(loads.values()) == len(TENANTS), loads


def test_a_stopped_replica_is_covered_by_the_others_and_gets_its_tenants_back(
    stack: Stack, tenants: list[list], placed: dict
) -> None:
    home = {name: placed["answers"][name][0]["replica"] for name, _ in tenants}
    intents = {name: placed["answers"][name][0]["intents"] for name, _ in tenants}
    moved = [pair for pair in tenants if home[pair[0]] == STOPPED]
    assert moved, "the stopped replica held no tenant"

    stack.compose("stop", STOPPED)
    covered = stack.inside({"until_served": moved, "seconds": FAILOVER_S})
    assert not covered["pending"], covered  # every tenant answered within FAILOVER_S seconds
    # The proxy retries a connection that fails on another replica: nothing is refused.
    assert not covered["failed"], covered["failed"]
    survivors = Ring([1, 3], weight=16)
    for name, answer in covered["served"].items():
        assert answer["intents"] == intents[name], (name, answer)  # the same model's answer
        assert answer["replica"] == replica_of(survivors.server(name)), (name, answer)
    slowest = max(answer["seconds"] for answer in covered["served"].values())
    print(f"{len(moved)} tenants of {STOPPED} answered by the others; slowest {slowest:.2f} s")
    # Only the stopped replica's tenants moved.
    staying = [pair for pair in tenants if home[pair[0]] != STOPPED]
    now = stack.inside({"classify": staying, "times": 1})
    assert {name: answers[0]["replica"] for name, answers in now.items()} == {
        name: home[name] for name, _ in staying
    }

    stack.compose("start", STOPPED)
    deadline = time.monotonic() + 120
    while True:
        back = stack.inside({"classify": moved, "times": 1})
        returned = [name for name, answers in back.items() if answers[0]["replica"] == STOPPED]
        if len(returned) == len(moved) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert len(returned) == len(moved), back
    assert all(answers[0]["intents"] == intents[name] for name, answers in back.items())
