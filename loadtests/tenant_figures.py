"""Figures for the multi-tenant runner under a Zipf load (``make tenant-figures``).

Starts the tenant runner alone with a memory budget holding a fraction of the demo tenants
(``make tenants`` first), sends classify requests whose tenant is drawn Zipf-style, and prints:
warm and cold latency (split by the runner's X-Tenant-Cache header), hit rate, and the worker's
peak resident memory against the budget.

    python -m loadtests.tenant_figures [--tenants 1000] [--budget-fraction 0.1] [--requests 4000]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path

import httpx
import numpy as np

from loadtests.processes import ROOT, bentoml_serve
from runners.tenants import demo
from runners.tenants.settings import TenantRunnerSettings
from runners.tenants.store import TenantStore, size_of


def group_peak_rss_mb(pgid: int) -> float:
    """Largest VmHWM (peak resident set) among the processes of a process group."""
    peak = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            for line in (stat.parent / "status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except (OSError, IndexError, ValueError):
            continue
    return peak / 1024


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


async def drive(
    url: str, requests: list[tuple[str, list[list[int]]]], concurrency: int
) -> list[tuple[float, str, int]]:
    results: list[tuple[float, str, int]] = []
    queue = iter(requests)
    async with httpx.AsyncClient(
        base_url=url, timeout=60, limits=httpx.Limits(max_connections=concurrency)
    ) as client:

        async def user() -> None:
            for tenant, ids in queue:
                started = time.perf_counter()
                resp = await client.post("/classify", json={"tenant": tenant, "ids": ids})
                results.append(
                    (
                        time.perf_counter() - started,
                        resp.headers.get("x-tenant-cache", "?"),
                        resp.status_code,
                    )
                )

        await asyncio.gather(*(user() for _ in range(concurrency)))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.tenant_figures", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--budget-fraction", type=float, default=0.1)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--zipf", type=float, default=1.1, help="exponent s: P(rank r) ~ 1/r^s")
    args = parser.parse_args(argv)

    import sentencepiece

    from models import contracts, store

    settings = TenantRunnerSettings()
    tenants = TenantStore(settings.store)
    names = [demo.tenant(i).name for i in range(1, args.tenants + 1)]
    missing = [n for n in names if tenants.current(n) is None]
    if missing:
        print(
            f"error: {len(missing)} demo tenants missing from {settings.store}: run `make tenants N={args.tenants}`"
        )
        return 2
    total = sum(size_of(tenants.current(n)[1]) for n in names)
    budget_mb = total * args.budget_fraction / (1 << 20)
    spm = sentencepiece.SentencePieceProcessor(
        model_file=str(store.path_of(contracts.SENTENCEPIECE) / "spiece.model")
    )
    rng = random.Random(0)
    ranked = names[:]
    rng.shuffle(ranked)  # popularity unrelated to tenant number
    weights = [1 / (rank**args.zipf) for rank in range(1, len(ranked) + 1)]
    phrases = {}
    requests = []
    for tenant in rng.choices(ranked, weights, k=args.requests):
        if tenant not in phrases:
            phrases[tenant] = spm.encode(
                [t for t, _ in demo.tenant(int(tenant.split("-")[1])).heldout_phrases[:8]]
            )
        requests.append((tenant, [rng.choice(phrases[tenant])]))
    distinct = len({t for t, _ in requests})
    print(f"{args.tenants} tenants, {total / (1 << 20):.0f} MB on disk; budget {budget_mb:.0f} MB "
          f"({args.budget_fraction:.0%}); {args.requests} requests, Zipf s={args.zipf}, {distinct} distinct tenants, "
          f"{args.concurrency} concurrent clients")  # fmt: skip

    env = {
        "BUNDLE_TENANTS_MEMORY_BUDGET_MB": f"{budget_mb:.1f}",
        "BUNDLE_TENANTS_STORE": str(settings.store),
    }
    server = bentoml_serve(
        "runners.tenants.service:TenantRunner", ROOT / "build" / "tenant-figures.log", env=env
    )
    with server:
        baseline_mb = group_peak_rss_mb(server.proc.pid)
        started = time.perf_counter()
        results = asyncio.run(drive(server.url, requests, args.concurrency))
        elapsed = time.perf_counter() - started
        stats = httpx.post(f"{server.url}/tenants/stats", json={}).json()
        peak_mb = group_peak_rss_mb(server.proc.pid)
    warm = [s * 1000 for s, cache, code in results if cache == "hit" and code == 200]
    cold = [s * 1000 for s, cache, code in results if cache == "miss" and code == 200]
    failed = sum(code != 200 for _, _, code in results)
    print(f"throughput {len(results) / elapsed:.0f} requests/s, failures {failed}")
    print(
        f"hit rate {len(warm) / max(1, len(warm) + len(cold)):.3f} ({len(warm)} warm, {len(cold)} cold)"
    )
    print(f"warm latency p50 {pct(warm, 50):.1f} ms, p99 {pct(warm, 99):.1f} ms")
    print(f"cold latency p50 {pct(cold, 50):.1f} ms, p99 {pct(cold, 99):.1f} ms "
          f"(mean load {stats['load_seconds'] / max(1, stats['loads']) * 1000:.1f} ms per model)")  # fmt: skip
    print(f"loaded models {stats['loaded']:.0f}, bytes in use {stats['bytes'] / (1 << 20):.0f} MB of "
          f"{stats['budget'] / (1 << 20):.0f} MB budget, evictions {stats['evictions']:.0f}")  # fmt: skip
    print(
        f"peak resident memory of the runner's processes: {peak_mb:.0f} MB (at start {baseline_mb:.0f} MB)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
