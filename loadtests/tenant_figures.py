"""Figures for the multi-tenant runner under a Zipf load (``make tenant-figures``).

    python -m loadtests.tenant_figures [--tenants 1000] [--budget-fraction 0.1] [--requests 4000]

What it measures: loadtests/README.md, "make tenant-figures". Exits 1 when a request failed, 3
when the worker's peak went above ready + 1.25 x budget, 2 when a store lacks tenants.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from models import demo_tenants as demo
from runners.tenants.loader import RESIDENT_PER_FILE_BYTE
from runners.tenants.settings import TenantRunnerSettings, default_store
from runners.tenants.store import TenantStore, size_of
from testkit.processes import ROOT, Server, bentoml_serve

RUNNER = "runners.tenants.service:TenantRunner"


@dataclass
class Result:
    tenant: str
    ms: float
    cache: str  # hit | miss
    status: int


def worker_rss_mb(server: Server, field: str = "VmHWM") -> float:
    """Largest VmHWM (peak resident set) or VmRSS (now) among the server's worker processes."""
    peak = 0
    for child in server.descendants():
        with contextlib.suppress(OSError):  # a worker that ended meanwhile
            for line in Path(f"/proc/{child.pid}/status").read_text().splitlines():
                if line.startswith(field + ":"):
                    peak = max(peak, int(line.split()[1]))
    return peak / 1024


def head_cost(head_store: Path, count: int, scratch: Path) -> tuple[float, float]:
    """Ready resident memory (MB) of a tenant runner worker with an empty store, and with demo
    head tenants 1..count (copied from ``head_store`` into a store of their own)."""
    ready = []
    for n in (0, count):
        store = scratch / f"heads-{n}"
        shutil.rmtree(store, ignore_errors=True)
        store.mkdir(parents=True)
        for index in range(1, n + 1):
            name = demo.tenant(index).name
            shutil.copytree(head_store / name, store / name, symlinks=True)
        env = {"BUNDLE_TENANTS_STORE": str(store)}
        log = ROOT / "build" / f"tenant-figures-heads-{n}.log"
        with bentoml_serve(RUNNER, log, env=env) as server:
            ready.append(worker_rss_mb(server, "VmRSS"))
        shutil.rmtree(store)
    return ready[0], ready[1]


def latency(ms: list[float]) -> str:
    p50, p99 = np.percentile(ms, [50, 99]) if ms else (float("nan"), float("nan"))
    return f"p50 {p50:.1f} ms, p99 {p99:.1f} ms"


async def drive(
    url: str, requests: list[tuple[str, list[list[int]]]], concurrency: int
) -> list[Result]:
    results: list[Result] = []
    queue = iter(requests)
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def user() -> None:
            for tenant, ids in queue:
                started = time.perf_counter()
                resp = await client.post("/classify", json={"tenant": tenant, "ids": ids})
                ms = (time.perf_counter() - started) * 1000
                cache = resp.headers.get("x-tenant-cache", "?")
                results.append(Result(tenant, ms, cache, resp.status_code))

        await asyncio.gather(*(user() for _ in range(concurrency)))
    return results


def zipf_requests(names: list[str], count: int, s: float, spm) -> list[tuple[str, list[list[int]]]]:
    rng = random.Random(0)
    ranked = names[:]
    rng.shuffle(ranked)  # popularity unrelated to tenant number
    weights = [1 / (rank**s) for rank in range(1, len(ranked) + 1)]
    phrases: dict[str, list[list[int]]] = {}
    requests = []
    for tenant in rng.choices(ranked, weights, k=count):
        if tenant not in phrases:
            spec = demo.tenant(int(tenant.split("-")[1]))
            phrases[tenant] = spm.encode([t for t, _ in spec.heldout_phrases[:8]])
        requests.append((tenant, [rng.choice(phrases[tenant])]))
    return requests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--budget-fraction", type=float, default=0.1)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--zipf", type=float, default=1.1, help="exponent s: P(rank r) ~ 1/r^s")
    parser.add_argument("--head-store", type=Path, default=default_store(), help="heads' store")
    args = parser.parse_args(argv)

    import sentencepiece

    from models import store
    from serving import contracts

    settings = TenantRunnerSettings()
    tenants = TenantStore(settings.store)
    names = [demo.tenant(i).name for i in range(1, args.tenants + 1)]
    if missing := [n for n in names if tenants.current(n) is None]:
        print(
            f"error: {len(missing)} demo tenants missing from {settings.store}: run `make tenants N={args.tenants}`"
        )
        return 2
    fmt = {name: demo.tenant(int(name.split("-")[1])).fmt for name in names}
    dirs = {n: found[1] for n in names if (found := tenants.current(n)) is not None}
    total = sum(size_of(dirs[n]) for n in names)
    resident = sum(size_of(dirs[n]) * RESIDENT_PER_FILE_BYTE[fmt[n]] for n in names)
    budget_mb = resident * args.budget_fraction / (1 << 20)
    spm = sentencepiece.SentencePieceProcessor(
        model_file=str(store.path_of(contracts.SENTENCEPIECE) / "spiece.model")
    )
    requests = zipf_requests(names, args.requests, args.zipf, spm)
    print(
        f"{args.tenants} tenants, {total / (1 << 20):.0f} MB on disk, ~{resident / (1 << 20):.0f} "
        f"MB if all were loaded; budget {budget_mb:.0f} MB ({args.budget_fraction:.0%}); "
        f"{args.requests} requests, Zipf s={args.zipf}, {len({t for t, _ in requests})} distinct "
        f"tenants, {args.concurrency} concurrent clients"
    )

    env = {"BUNDLE_TENANTS_MEMORY_BUDGET_MB": f"{budget_mb:.1f}",
           "BUNDLE_TENANTS_STORE": str(settings.store)}  # fmt: skip
    with bentoml_serve(RUNNER, ROOT / "build" / "tenant-figures.log", env=env) as server:
        # The bound's base is the worker's high-water mark once ready (start-up included: the
        # runtimes' imports and warm-up); its resident size then is printed beside it.
        ready_mb, ready_now_mb = worker_rss_mb(server), worker_rss_mb(server, "VmRSS")
        started = time.perf_counter()
        results = asyncio.run(drive(server.url, requests, args.concurrency))
        elapsed = time.perf_counter() - started
        stats = httpx.post(f"{server.url}/tenants/stats", json={}).json()
        peak_mb, now_mb = worker_rss_mb(server), worker_rss_mb(server, "VmRSS")

    ok = [r for r in results if r.status == 200]
    warm = [r.ms for r in ok if r.cache == "hit"]
    cold = [r.ms for r in ok if r.cache == "miss"]
    print(f"throughput {len(results) / elapsed:.0f} requests/s, failures {len(results) - len(ok)}")
    print(f"hit rate {len(warm) / max(1, len(ok)):.3f} ({len(warm)} warm, {len(cold)} cold)")
    print(f"warm latency {latency(warm)}")
    print(f"cold latency {latency(cold)}")
    for kind in ("onnx", "tf"):
        cold_kind = [r.ms for r in ok if r.cache == "miss" and fmt[r.tenant] == kind]
        print(f"  cold {kind:<4} {latency(cold_kind)} ({len(cold_kind)})")
    print(
        f"mean load {stats['load_seconds'] / max(1, stats['loads']) * 1000:.1f} ms over {stats['loads']:.0f} loads"
    )
    print(
        f"loaded models {stats['loaded']:.0f}, bytes in use {stats['bytes'] / (1 << 20):.0f} MB of "
        f"{stats['budget'] / (1 << 20):.0f} MB budget, evictions {stats['evictions']:.0f}"
    )
    bound_mb = ready_mb + 1.25 * budget_mb
    within = peak_mb <= bound_mb
    print(
        f"runner worker resident memory: {ready_mb:.0f} MB when ready (runtimes loaded; peak so "
        f"far, {ready_now_mb:.0f} MB resident then), peak {peak_mb:.0f} MB, {now_mb:.0f} MB at the "
        f"end; ready + 1.25 x budget = {bound_mb:.0f} MB ({'within' if within else 'OVER'})"
    )
    failed = 1 if len(ok) < len(results) else 0 if within else 3
    heads = TenantStore(args.head_store)
    if any(heads.current(n) is None for n in names):
        print(
            f"head tenants: not measured, {args.head_store} lacks some: run `make tenants N={args.tenants}`"
        )
        return failed or 2
    empty_mb, full_mb = head_cost(args.head_store, args.tenants, ROOT / "build" / "tenant-figures")
    print(
        f"head tenants: {args.tenants} resident, worker {full_mb:.0f} MB against {empty_mb:.0f} MB "
        f"with an empty store (+{full_mb - empty_mb:.0f} MB), every one read at start-up (no request loads a head)"
    )
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
