"""One load point: wrk against a server for a few seconds, read back as a ``Point`` with the CPU
each server process spent per request; and the workloads, user counts and systems of a run.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from loadtests import cpu, loadgen
from testkit.processes import ROOT, Server

OUT = Path(os.environ.get("BENCH_OUT", ROOT / "build" / "bench"))
QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
WORKLOADS = {"chat": 1, "bulk": loadgen.BULK}  # sentences per request (/embed)
# One user (what batching costs when there is nothing to batch), then the ramp from 16 to 160.
# A quick run (CI) measures every system once, at a light load.
USERS = (1, 8) if QUICK else (1, 16, 64, 160)
MIDDLE = USERS[-1] if QUICK else 64
# Bulk points run longer: a one-request-at-a-time server answers a bulk request at 64 users in
# about as long as a chat point lasts, and would complete none.
BULK_LONGER = 2 if QUICK else 3
STACK, INT8, NOBATCH = "stack", "stack, int8", "stack, batching off"
FASTAPI, NAIVE, HANDWRITTEN = "fastapi", "naive bentoml", "hand-written batching"
SYSTEMS = (STACK, INT8, NOBATCH, FASTAPI, NAIVE, HANDWRITTEN)


@dataclass
class Point:
    system: str
    workload: str
    users: int
    repeat: int
    sentences_per_s: float  # of answered 200s only
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    requests: int  # answered, any status
    failures: int  # not 200 and not shed (a 5xx other than 503, a reset, a timeout)
    shed: int  # refused with 429/503 + Retry-After
    loadgen_cpu_share: float  # the load generator's CPU seconds / (wall seconds x cores)
    cpu_ms_per_request: dict[str, dict[str, float]] = field(default_factory=dict)
    # Servers restarted just before this point: they had not worked off an earlier point's queue
    # (loadtests.bench.settle); the report counts them.
    restarted: list[str] = field(default_factory=list)


def bodies(workload: str, backend: str = "") -> Path:
    name = f"{workload}-{backend or 'default'}-embed.jsonl"
    return loadgen.write_bodies(workload, OUT / "bodies" / name, backend=backend)


def loaded(
    server: Server, path: str, bodies: Path, users: int, seconds: float
) -> tuple[loadgen.Load, dict[str, dict[str, float]]]:
    """wrk's load, and every process's CPU (/proc) and the runners' engine CPU (``/metrics``) per
    request: the counter read outside the /proc window, so its request is not counted in it."""
    engine_before = cpu.engine_seconds(server.url)
    before = cpu.snapshot(server)
    load = loadgen.run(server.url, path, bodies, users, seconds)
    after = cpu.snapshot(server)
    engine = (engine_before, cpu.engine_seconds(server.url))
    return load, cpu.per_request(before, after, load.ok, engine)


def point(
    server: Server,
    system: str,
    workload: str,
    users: int,
    seconds: float,
    repeat: int = 0,
    backend: str = "",
    restarted: list[str] | None = None,
) -> Point:
    load, cpu_ms = loaded(server, "/embed", bodies(workload, backend), users, seconds)
    ok_per_s = load.ok / load.seconds
    return Point(
        system, workload, users, repeat,
        sentences_per_s=ok_per_s * WORKLOADS.get(workload, 1), requests_per_s=ok_per_s,
        p50_ms=load.p50_ms, p99_ms=load.p99_ms, requests=load.requests,
        failures=load.failed, shed=load.shed,
        loadgen_cpu_share=load.loadgen_cpu_s / (load.seconds * (os.cpu_count() or 1)),
        cpu_ms_per_request=cpu_ms, restarted=list(restarted or []),
    )  # fmt: skip


def drain(url: str, timeout_s: float = 120) -> bool:
    """Wait until the server has worked off what the last point left queued: a one-sentence request
    must answer in 0.5 s. False if none did within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        sent = time.monotonic()
        try:
            resp = httpx.post(f"{url}/embed", json={"texts": ["drain"]}, timeout=min(30.0, left))
            if resp.status_code == 200 and time.monotonic() - sent < 0.5:
                return True
        except httpx.HTTPError:  # refused, reset, timed out, cut short
            pass
        time.sleep(max(0.0, min(0.5, deadline - time.monotonic())))
    return False
