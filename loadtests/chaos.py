"""The stack's worst day, measured: overload at 4x capacity, then workers killed under load.

    python -m loadtests.chaos [--seconds 20] [--json build/chaos.json]   (make chaos)

The phases and what each counts: loadtests/README.md, "make chaos and make soak".
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from loadtests import cpu
from loadtests.bench import write
from loadtests.openloop import Driver, Outcome, Request, ms, quantile
from models import corpus
from testkit.processes import ROOT, Server, bentoml_serve

BULK = 32
# fp32 embeddings of one text differ only by float rounding across batch shapes (~1e-7).
MAX_ABS_DIFF = 1e-5


@dataclass
class Phase:
    name: str
    offered_per_s: float
    outcomes: list[Outcome] = field(default_factory=list, repr=False)
    inflight_at_kill: int | None = None  # requests sent and unanswered when a worker was killed
    # the client's connections then open, busy or idle: each dies with a killed tokenizer worker,
    # and an idle one can still be picked for a request before the client sees it closed
    connections_at_kill: int | None = None

    def summary(self) -> dict:
        ok = [o for o in self.outcomes if o.status == 200]
        shed = [o for o in self.outcomes if o.status in (429, 503) and not o.expired]
        expired = [o for o in self.outcomes if o.expired]
        other = [o for o in self.outcomes if o.status not in (200, 429, 503)]
        kinds = Counter(f"{o.status} {o.error}".strip() for o in other)
        start = min((o.sent for o in self.outcomes), default=0)
        span = max((o.sent + o.latency_s for o in self.outcomes), default=0) - start
        failed = shed + expired + other
        return {
            "phase": self.name, "offered_per_s": round(self.offered_per_s, 1),
            "requests": len(self.outcomes), "served": len(ok),
            "served_per_s": round(len(ok) / span, 2) if span else 0.0,
            "served_p50_ms": ms(quantile([o.latency_s for o in ok], 0.5)),
            "served_p99_ms": ms(quantile([o.latency_s for o in ok], 0.99)),
            "refused": len(shed),
            "refused_without_retry_after": sum(o.retry_after is None for o in shed + expired),
            "refused_at_admission": sum(o.at_admission for o in shed),
            "refusal_p50_ms": ms(quantile([o.latency_s for o in shed], 0.5)),
            "refusal_p99_ms": ms(quantile([o.latency_s for o in shed], 0.99)),
            "expired": len(expired),
            "expired_max_ms": ms(max((o.latency_s for o in expired), default=None)),
            "statuses": dict(sorted(Counter(str(o.status) for o in self.outcomes).items())),
            "server_errors": sum(o.status >= 500 and o.status != 503 for o in self.outcomes),
            "wrong_answers": sum(o.status == -1 for o in self.outcomes),
            "transport_errors": sum(o.status == 0 for o in self.outcomes),
            "inflight_at_kill": self.inflight_at_kill,
            "connections_at_kill": self.connections_at_kill,
            "other_errors": len(other), "other_error_kinds": dict(kinds.most_common()),
            "slowest_failure_ms": ms(max((o.latency_s for o in failed), default=None)),
        }  # fmt: skip


class Bulk:
    """Bulk /embed requests from a pool of corpus texts, each answer checked against reference
    embeddings taken from the same stack unloaded."""

    def __init__(self, pool: int = 256, seed: int = 3) -> None:
        self.texts = random.Random(seed).sample(corpus.load_texts(), pool)
        self.reference: dict[str, np.ndarray] = {}

    def request(self, rng: random.Random) -> Request:
        return "/embed", {"texts": rng.sample(self.texts, BULK)}

    async def take_reference(self, client: httpx.AsyncClient) -> None:
        for start in range(0, len(self.texts), BULK):
            texts = self.texts[start : start + BULK]
            resp = (await client.post("/embed", json={"texts": texts})).raise_for_status()
            for text, vector in zip(texts, resp.json()["embeddings"], strict=True):
                self.reference[text] = np.asarray(vector, dtype=np.float32)

    def wrong(self, request: Request, resp: httpx.Response) -> str:
        """Why an answer is wrong ('' if right): count, or a vector off its reference."""
        texts, embeddings = request[1]["texts"], resp.json()["embeddings"]
        if len(embeddings) != len(texts):
            return f"{len(embeddings)} vectors for {len(texts)} texts"
        got = np.asarray(embeddings, dtype=np.float32)
        want = np.stack([self.reference[t] for t in texts])
        diff = float(np.max(np.abs(got - want)))
        return f"max |diff| {diff:.1e} from the reference" if diff > MAX_ABS_DIFF else ""


async def closed(driver: Driver, name: str, clients: int, seconds: float) -> Phase:
    phase = Phase(name, 0.0)
    await driver.closed(clients, seconds, phase.outcomes)
    phase.offered_per_s = len(phase.outcomes) / seconds
    return phase


async def answered_s(
    driver: Driver, into: list[Outcome], in_a_row: int, within_s: float, pause_s: float
) -> float | None:
    """Seconds until ``in_a_row`` requests in a row are answered 200 within ``within_s`` each
    (None after 60 s); each request is counted in ``into`` like every other."""
    started = time.monotonic()
    streak = 0
    while time.monotonic() - started < 60:
        o = await driver.one(into)
        streak = streak + 1 if o.status == 200 and o.latency_s <= within_s else 0
        if streak == in_a_row:
            return round(time.monotonic() - started, 2)
        await asyncio.sleep(pause_s)
    return None


async def kill_during_load(
    driver: Driver, server: Server, service: str, per_s: float, seconds: float
) -> tuple[Phase, float | None]:
    async def kill_then_measure() -> float | None:
        await asyncio.sleep(seconds / 3)
        victim = cpu.workers(server, service)[0]
        phase.inflight_at_kill = driver.inflight
        phase.connections_at_kill = driver.open_connections()
        os.kill(victim.pid, signal.SIGKILL)
        # Serving again: a request through the whole graph answers 200 (one of this phase).
        return await answered_s(driver, phase.outcomes, 1, float("inf"), 0.2)

    phase = Phase(f"kill {service}", per_s)
    killer = asyncio.create_task(kill_then_measure())
    await driver.open(per_s, seconds, phase.outcomes)
    return phase, await killer


async def workers_serving(client: httpx.AsyncClient, server: Server) -> dict[str, bool]:
    """Each service's worker alive (by PID, among the server's descendants) and answering: a
    request that goes through that service."""
    probes = {  # an unknown tenant is a 404 from the tenant runner itself, naming the tenant
        "tokenizer": ("/tokenize", {"texts": ["alive"]}, 200),
        "onnx_runner": ("/embed", {"texts": ["alive"], "backend": "onnx"}, 200),
        "tf_runner": ("/embed", {"texts": ["alive"], "backend": "tf"}, 200),
        "tenant_runner": ("/classify", {"tenant": "no-such-tenant", "texts": ["alive"]}, 404),
    }
    status = {}
    for service, (path, body, expected) in probes.items():
        alive = any(proc.is_running() for proc in cpu.workers(server, service))
        resp = await client.post(path, json=body)
        named = expected == 200 or "no-such-tenant" in resp.json().get("error", "")
        status[service] = alive and resp.status_code == expected and named
    return status


async def run(server: Server, seconds: float) -> dict:
    bulk = Bulk()
    async with Driver(server.url, bulk.request, check=bulk.wrong) as driver:
        await bulk.take_reference(driver.client)
        probes = Phase("recovery probes", 0.0)  # the requests that time recovery
        baseline = await closed(driver, "unloaded", 1, min(5.0, seconds))
        baseline_p50 = quantile([o.latency_s for o in baseline.outcomes], 0.5) or 1.0
        # Recovered: three answers in a row at most 3x the unloaded median latency.
        recovery = (probes.outcomes, 3, 3 * baseline_p50, 0.1)
        capacity = await closed(driver, "capacity", 8, seconds)
        per_s = capacity.summary()["served_per_s"]
        print(f"capacity: {per_s:.1f} bulk requests/s ({per_s * BULK:.0f} sentences/s)", flush=True)
        print(f"overload: {4 * per_s:.1f} requests/s for {seconds:.0f} s …", flush=True)
        overload = Phase("overload 4x", 4 * per_s)
        await driver.open(overload.offered_per_s, seconds, overload.outcomes)
        recovered = await answered_s(driver, *recovery)
        print(f"  refused {overload.summary()['refused']}; recovered in {recovered} s", flush=True)
        report: dict[str, Any] = {
            "url": server.url, "seconds_per_phase": seconds, "bulk_sentences": BULK,
            "phases": [p.summary() for p in (baseline, capacity, overload)],
            "recovery_after_overload_s": recovered, "kills": [],
        }  # fmt: skip
        for service in ("onnx_runner", "tokenizer"):
            print(f"SIGKILL the {service} worker under load …", flush=True)
            phase, again = await kill_during_load(driver, server, service, per_s / 2, seconds)
            print(f"  serving again after {again} s", flush=True)
            report["phases"].append(phase.summary())
            report["kills"].append({"service": service, "serving_again_s": again})
            await answered_s(driver, *recovery)
        report["server_alive"] = server.proc is not None and server.proc.poll() is None
        report["workers_serving"] = await workers_serving(driver.client, server)
        report["phases"].append(probes.summary())
        return report


def render(report: dict) -> str:
    lines = [
        "| phase | offered/s | statuses | served/s | served p99 ms | refused | refusal p99 ms | expired waiting | no Retry-After | in flight at kill | other errors | slowest failure ms |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in report["phases"]:
        lines.append(
            f"| {p['phase']} | {p['offered_per_s']} | {p['statuses']} | {p['served_per_s']} | {p['served_p99_ms']} "
            f"| {p['refused']} | {p['refusal_p99_ms']} | {p['expired']} | {p['refused_without_retry_after']} | {p['inflight_at_kill'] if p['inflight_at_kill'] is not None else ''} "
            f"| {p['other_errors']} {p['other_error_kinds'] or ''} | {p['slowest_failure_ms']} |"
        )
    lines.append(f"\nrecovery after overload: {report['recovery_after_overload_s']} s")
    for kill in report["kills"]:
        lines.append(
            f"{kill['service']} worker SIGKILLed: serving again after {kill['serving_again_s']} s"
        )
    lines.append(f"workers alive and serving after the run: {report['workers_serving']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20, help="length of each phase")
    parser.add_argument("--json", type=Path, default=ROOT / "build" / "chaos.json")
    args = parser.parse_args(argv)
    with bentoml_serve(".", ROOT / "build" / "chaos" / "stack.log") as server:
        report = asyncio.run(run(server, args.seconds))
    print(render(report))
    print(f"\nwritten: {write(args.json, report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
