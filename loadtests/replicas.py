"""Tenants across tenant-runner replicas, simulated past one machine (``make simulate-replicas``).

10,000 tenants, requests drawn Zipf-style, R = 1…8 replicas each with its own memory budget and an
LRU of models, three routings: random (what a plain load balancer does), consistent hashing, and
consistent hashing with bounded load (HAProxy's rule: loadtests/routing.py). Halfway through, one
replica is lost. Printed per routing and R: models resident per replica and resident models across
replicas against the distinct tenants they hold (1.0: no tenant held twice), both just before the
loss; the hit rate once the caches are warm (the second quarter) and after the loss (the second
half); the most requests any replica had in flight over the average (what bounded load caps); the
share of tenants whose replica changes at the loss and when a replica is added (the hash placement,
load aside); and the seconds spent loading models. A model's load time and resident size come from
loading real tenant models of a store with the runner's loader (``--store``; the size is the
loader's estimate, file bytes x its measured factor per format), or are given. Each request holds a
replica for the same time whether it loaded a model or not: the load time is counted, not simulated.
The ring has 256 points a replica (HAProxy's ``weight 16``): at weight 1 (16 points) moves run ~15 %
over 1/R; the proxy is to be configured the same.

    python -m loadtests.replicas [--store DIR] [--tenants 10000] [--requests 200000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path

from loadtests.routing import Ring

ROUTINGS = ("random", "consistent hash", "bounded load")
WEIGHT = 16  # 256 points a replica on the ring: moves stay within ~1/R (16 points: +15 %)


@dataclass
class Costs:
    model_mb: float  # resident memory of one loaded model
    load_ms: float  # time to load one
    source: str


def measured_costs(store: Path, sample: int = 20) -> Costs:
    """Load up to ``sample`` tenant models of a store with the runner's own loader."""
    from runners.tenants.loader import load
    from runners.tenants.store import TenantStore

    tenants = TenantStore(store)
    sizes, seconds = [], []
    warm: set[bool] = set()
    for name in tenants.names()[:sample]:
        version, directory = tenants.require(name)
        model = load(name, version, directory)
        tf = (directory / "saved_model").exists()
        if tf not in warm:  # the first load of a format starts its runtime (TF: ~2.4 s), which the
            warm.add(tf)  # runner pays once at start (warm_up_runtimes): timed the second time
            model = load(name, version, directory)
        sizes.append(model.nbytes / 2**20)
        seconds.append(model.load_seconds)
    if not sizes:
        raise SystemExit(
            f"error: no tenant in {store}: `make tenants-mixed` builds the demo whole-model tenants"
        )
    return Costs(
        statistics.mean(sizes),
        statistics.mean(seconds) * 1000,
        f"{len(sizes)} models of {store} loaded with the runner's loader: mean load time, mean "
        "resident estimate (file bytes x the loader's measured factor per format)",
    )


def zipf(tenants: int, count: int, s: float, rng: random.Random) -> list[int]:
    weights = [1 / (rank**s) for rank in range(1, tenants + 1)]
    return rng.choices(range(tenants), weights=weights, k=count)


def name(tenant: int) -> str:
    return f"tenant-{tenant:05d}"


def moved(before: Ring, after: Ring, tenants: int) -> float:
    """Share of tenants whose replica differs between two rings (load aside)."""
    return sum(before.server(name(t)) != after.server(name(t)) for t in range(tenants)) / tenants


def simulate(
    routing: str,
    replicas: int,
    arrivals: list[int],
    capacity: int,
    concurrency: int,
    factor: int,
    seed: int = 1,
) -> dict:
    """One run: ``capacity`` models fit each replica's budget; ``concurrency`` requests in flight
    (the bounded-load rule counts them); the last replica is lost halfway (if R > 1)."""
    rng = random.Random(seed)
    up = list(range(1, replicas + 1))
    ring = Ring(up, WEIGHT)
    caches: dict[int, OrderedDict[int, None]] = {r: OrderedDict() for r in up}
    in_flight: Counter[int] = Counter()
    window: deque[int] = deque()
    hits = [0, 0]  # warm (the second quarter: caches filled), after the loss (the second half)
    seen = [0, 0]
    loads = 0
    peak = 0.0  # the most any replica had in flight, over the average
    lose_at = len(arrivals) // 2 if replicas > 1 else None
    placed: dict = {}
    for i, tenant in enumerate(arrivals):
        if i == lose_at:
            placed = placement(caches)  # the steady state, before the loss
            lost = up.pop()
            ring = Ring(up, WEIGHT)
            del caches[lost]
            in_flight.pop(lost, None)
            window = deque(r for r in window if r != lost)
        if routing == "random":
            replica = rng.choice(up)
        elif routing == "consistent hash":
            replica = ring.server(name(tenant))
        else:
            replica = ring.bounded(name(tenant), in_flight, factor)
        period = 1 if lose_at is not None and i >= lose_at else 0
        counted = period == 1 or len(arrivals) // 4 <= i
        seen[period] += counted
        cache = caches[replica]
        if tenant in cache:
            hits[period] += counted
            cache.move_to_end(tenant)
        else:
            loads += 1
            cache[tenant] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
        window.append(replica)
        in_flight[replica] += 1
        if len(window) > concurrency:
            in_flight[window.popleft()] -= 1
            peak = max(peak, in_flight[replica] * len(up) / concurrency)
    return {
        "routing": routing,
        "replicas": replicas,
        **(placed or placement(caches)),
        "hit_rate_before_loss": hits[0] / max(seen[0], 1),
        "hit_rate_after_loss": hits[1] / seen[1] if seen[1] else None,
        "loads": loads,
        "peak_load": peak,
    }


def placement(caches: dict[int, OrderedDict[int, None]]) -> dict:
    resident = [len(c) for c in caches.values()]
    distinct = len(set().union(*caches.values()))
    return {
        "resident_per_replica_mean": statistics.mean(resident),
        "resident_per_replica_max": max(resident),
        "resident_total": sum(resident),
        "distinct_resident": distinct,
        "copies_per_tenant": sum(resident) / max(distinct, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.replicas", description=__doc__)
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--zipf", type=float, default=1.1, help="exponent s: P(rank r) ~ 1/r^s")
    parser.add_argument("--max-replicas", type=int, default=8)
    parser.add_argument("--budget-mb", type=float, default=256, help="per replica (compose's)")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    parser.add_argument("--factor", type=int, default=150, help="hash-balance-factor (percent)")
    parser.add_argument(
        "--store",
        type=Path,
        help="measure model costs from this tenant store (default: the runner's)",
    )
    parser.add_argument("--model-mb", type=float, help="resident MB per model (without --store)")
    parser.add_argument("--load-ms", type=float, help="ms to load a model (without --store)")
    args = parser.parse_args(argv)
    if (args.model_mb is None) != (args.load_ms is None):
        parser.error("--model-mb and --load-ms go together")
    if args.model_mb is not None:
        costs = Costs(args.model_mb, args.load_ms, "given on the command line")
    else:
        from runners.tenants.settings import TenantRunnerSettings

        costs = measured_costs(args.store or TenantRunnerSettings().store)
    capacity = max(1, int(args.budget_mb // costs.model_mb))
    arrivals = zipf(args.tenants, args.requests, args.zipf, random.Random(7))
    print(
        f"{args.tenants} tenants, {args.requests} requests (Zipf s={args.zipf}), "
        f"{args.concurrency} in flight, budget {args.budget_mb:.0f} MB a replica = {capacity} "
        f"models of {costs.model_mb:.1f} MB (load {costs.load_ms:.0f} ms; {costs.source}); "
        f"bounded load at {args.factor} %; the last replica lost halfway",
        flush=True,
    )
    print(
        "| routing | R | models per replica (mean / max) | resident ÷ distinct tenants | "
        "hit rate | after the loss | peak in flight ÷ average | moved at the loss | "
        "moved adding one | load s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for replicas in range(1, args.max_replicas + 1):
        ring = Ring(range(1, replicas + 1), WEIGHT)
        lost = moved(ring, Ring(range(1, replicas), WEIGHT), args.tenants) if replicas > 1 else 0
        added = moved(ring, Ring(range(1, replicas + 2), WEIGHT), args.tenants)
        for routing in ROUTINGS:
            r = simulate(routing, replicas, arrivals, capacity, args.concurrency, args.factor)
            after = r["hit_rate_after_loss"]
            # Random routing has no placement: any tenant may go anywhere, before and after.
            shares = ("—", "—") if routing == "random" else (f"{lost:.3f}", f"{added:.3f}")
            if replicas == 1:
                shares = ("—", shares[1])
            print(
                f"| {routing} | {replicas} | {r['resident_per_replica_mean']:.0f} / "
                f"{r['resident_per_replica_max']} | {r['copies_per_tenant']:.2f} | "
                f"{r['hit_rate_before_loss']:.3f} | {'—' if after is None else f'{after:.3f}'} | "
                f"{r['peak_load']:.2f} | {shares[0]} | {shares[1]} | "
                f"{r['loads'] * costs.load_ms / 1000:.0f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
