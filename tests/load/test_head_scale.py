"""10,000 head tenants in one tenant runner (`bentoml serve`, the runner alone): every head is
resident from the start (no request waits for a load), any tenant answers, and the resident memory
they add stays within 500 MB of the same runner with an empty store.

The store is written straight to the store's layout (one version per tenant, random weights of the
demo tenants' label counts): what is measured is holding and serving 10,000 heads, not training
them (tests/integration/test_heads.py gates their accuracy). It is built once under build/ and
reused."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from runners.tenants import heads
from runners.tenants.store import Manifest, write_manifest
from testkit.processes import ROOT, Servers, bentoml_serve, log_path

COUNT = 10_000
STORE = ROOT / "build" / "test-heads-10k"
EXTRA_MB = 500
# The heads name the default catalogue's embed model and are as wide as its vectors.
ENCODER, WIDTH = "all-MiniLM-L6-v2", 384


def build_store(root: Path) -> Path:
    """COUNT head tenants, each a current version (manifest + head.npz), written once."""
    done = root / ".complete"
    if done.exists():
        return root
    rng = np.random.default_rng(0)
    (root / ".staging").mkdir(parents=True, exist_ok=True)
    for index in range(COUNT):
        tenant = root / f"head-{index:05d}"
        version = tenant / "versions" / "v1"
        version.mkdir(parents=True, exist_ok=True)
        labels = [f"intent-{n}" for n in range(6 + index % 7)]  # 6-12, as the demo tenants
        weights = rng.standard_normal((WIDTH, len(labels)), dtype=np.float32)
        heads.save(version, weights, np.zeros(len(labels), np.float32))
        write_manifest(
            version, Manifest(format="head", labels=labels, source="demo", encoder=ENCODER)
        )
        if not (tenant / "current").is_symlink():
            os.symlink("versions/v1", tenant / "current")
    done.touch()
    return root


def resident_mb(server) -> float:
    """Resident memory of the server's processes (the arbiter and its worker), MB."""
    total = 0
    for proc in [server.process(), *server.descendants()]:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += proc.memory_info().rss
    return total / 2**20


@pytest.fixture(scope="module")
def runners(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[str, float]]]:
    """The tenant runner on an empty store, then on the 10,000 heads: (URL, resident MB) each,
    the second left running for the tests."""
    empty = tmp_path_factory.mktemp("empty-store")
    build_store(STORE)
    found: dict[str, tuple[str, float]] = {}
    target = "runners.tenants.service:TenantRunner"
    # launched together (the 10,000 heads' read is one process's): each measured on its own tree
    both = {
        name: bentoml_serve(target, log_path(f"heads-{log}.log"), {"BUNDLE_TENANTS_STORE": str(at)})
        for name, log, at in (("empty", "empty", empty), ("heads", "10k", STORE))
    }
    with Servers(both) as up:
        for name, server in up.items():
            httpx.post(f"{server.url}/tenants/stats", json={}, timeout=30).raise_for_status()
            found[name] = (server.url, resident_mb(server))
        up["empty"].stop()
        yield found


def test_ten_thousand_heads_are_resident_within_500_mb(runners) -> None:
    (_, empty_mb), (url, heads_mb) = runners["empty"], runners["heads"]
    stats = httpx.post(f"{url}/tenants/stats", json={}, timeout=30).json()
    print(f"resident: {empty_mb:.0f} MB empty, {heads_mb:.0f} MB with {COUNT} heads "
          f"({stats['head_bytes'] / 2**20:.0f} MB of weights)")  # fmt: skip
    assert stats["heads"] == COUNT and stats["head_reads"] == COUNT
    assert heads_mb - empty_mb <= EXTRA_MB


def test_any_tenant_answers_without_a_load(runners) -> None:
    url = runners["heads"][0]
    before = httpx.post(f"{url}/tenants/stats", json={}, timeout=30).json()
    rng = np.random.default_rng(1)
    with httpx.Client(base_url=url, timeout=30) as client:
        for index in random.Random(2).sample(range(COUNT), 25):
            vectors = rng.standard_normal((3, WIDTH))
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            tenant = f"head-{index:05d}"
            reply = client.post(
                "/classify",
                json={"tenant": tenant, "vectors": vectors.tolist(), "encoder": ENCODER},
                headers={"Content-Type": "application/json"},
            )
            assert reply.status_code == 200, reply.text
            body = reply.json()
            assert body["format"] == "head" and body["cache"] == "hit" and body["version"] == "v1"
            assert len(body["intents"]) == 3 and all(0 < s <= 1 for s in body["scores"])
            # The runner's answer is the head's: the same matrix product here.
            head = heads.load("v1", STORE / tenant / "versions" / "v1")
            expected = [
                head.labels[i] for i in head.probabilities(vectors.astype(np.float32)).argmax(1)
            ]
            assert body["intents"] == expected
        # Token ids to a head: refused (409), the caller sends vectors instead.
        wrong = client.post("/classify", json={"tenant": "head-00001", "ids": [[5, 6]]})
        assert wrong.status_code == 409 and "vectors" in wrong.text
    after = httpx.post(f"{url}/tenants/stats", json={}, timeout=30).json()
    assert after["head_reads"] == before["head_reads"]  # nothing read on a request
    assert after["loads"] == before["loads"] == 0 and after["misses"] == 0
