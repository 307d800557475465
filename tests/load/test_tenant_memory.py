"""The memory budget bounds memory: a tenant runner (`bentoml serve`, the runner alone) churned
through 150 whole-model tenants (ONNX, every fourth TF) with a 96 MB budget — nearly every request a load
and an eviction — keeps its worker's peak resident memory within ready + 1.25 × budget.

The tenants are copies of two trained models (one per format, ~3 MB of files each), written once
under build/: each copy is loaded as its own session or SavedModel, which is what churn costs."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import httpx
import sentencepiece

from loadtests.tenant_figures import worker_rss_mb
from models import demo_tenants as demo
from models import store as model_store
from runners.tenants import registry
from runners.tenants.store import TenantStore
from serving import contracts
from testkit.processes import ROOT, bentoml_serve, log_path

STORE = ROOT / "build" / "test-churn"
TENANTS = 150
BUDGET_MB = 96


def spm() -> sentencepiece.SentencePieceProcessor:
    path = model_store.path_of(contracts.SENTENCEPIECE) / "spiece.model"
    return sentencepiece.SentencePieceProcessor(model_file=str(path))


def build_store(root: Path) -> Path:
    if (root / ".complete").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    tenants = TenantStore(root)
    for fmt, index in (("onnx", 5), ("tf", 7)):
        spec = demo.tenant(index)
        registry.train(
            tenants, f"seed-{fmt}", spm().encode([t for t, _ in spec.train]), [i for _, i in spec.train],
            fmt=fmt, dim=384, epochs=5,
        )  # fmt: skip
    for i in range(TENANTS):
        fmt = "tf" if i % 4 == 3 else "onnx"
        shutil.copytree(root / f"seed-{fmt}", root / f"churn-{i:04d}", symlinks=True)
    (root / ".complete").touch()
    return root


def test_churn_through_whole_models_stays_within_ready_plus_budget() -> None:
    root = build_store(STORE)
    ids = spm().encode(["where is my order"])
    order = [f"churn-{i:04d}" for i in range(TENANTS)] * 2
    random.Random(0).shuffle(order)
    env = {"BUNDLE_TENANTS_STORE": str(root), "BUNDLE_TENANTS_MEMORY_BUDGET_MB": str(BUDGET_MB)}
    with bentoml_serve(
        "runners.tenants.service:TenantRunner", log_path("tenant-churn.log"), env=env
    ) as server:
        ready = worker_rss_mb(server)  # VmHWM: its size once ready, start-up included
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for tenant in order:
                reply = client.post("/classify", json={"tenant": tenant, "ids": ids})
                assert reply.status_code == 200, reply.text
            stats = client.post("/tenants/stats", json={}).json()
        peak = worker_rss_mb(server)  # VmHWM: the highest it has been
    print(f"worker resident: {ready:.0f} MB ready, peak {peak:.0f} MB; budget {BUDGET_MB} MB, "
          f"bound {ready + 1.25 * BUDGET_MB:.0f} MB; {stats['loads']:.0f} loads, "
          f"{stats['evictions']:.0f} evictions")  # fmt: skip
    assert stats["evictions"] >= TENANTS  # it did churn: most requests loaded and evicted
    assert stats["bytes"] <= stats["budget"]
    assert peak <= ready + 1.25 * BUDGET_MB
