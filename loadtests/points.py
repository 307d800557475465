"""One load point: wrk against a server for a few seconds, read back as a ``Point`` with the CPU
each server process spent per request.

The workloads, the user counts of a run and the names of the systems compared are defined here, so
the benchmark, its report and the tests share them.
"""

from __future__ import annotations

import os
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from loadtests import cpu, loadgen
from loadtests.processes import ROOT, Server

OUT = Path(os.environ.get("BENCH_OUT", ROOT / "build" / "bench"))
QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
WORKLOADS = {"chat": 1, "bulk": loadgen.BULK}  # sentences per request
# One user (what batching costs when there is nothing to batch), then the ramp from 16 to 160.
# A quick run (CI) keeps the points short and light.
USERS = (1, 8) if QUICK else (1, 16, 64, 160)
MIDDLE = USERS[-1] if QUICK else 64
STACK, INT8, NOBATCH, FASTAPI, NAIVE, HANDWRITTEN = (
    "stack",
    "stack, int8",
    "stack, batching off",
    "fastapi",
    "naive bentoml",
    "hand-written batching",
)
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


def bodies(workload: str, backend: str) -> Path:
    return loadgen.write_bodies(
        workload, OUT / "bodies" / f"{workload}-{backend or 'default'}.jsonl", backend=backend
    )


def point(
    server: Server,
    system: str,
    workload: str,
    users: int,
    seconds: float,
    repeat: int = 0,
    backend: str = "",
) -> Point:
    before = cpu.snapshot([server.process(), *server.descendants()])
    load = loadgen.run(server.url, "/embed", bodies(workload, backend), users, seconds)
    after = cpu.snapshot([server.process(), *server.descendants()])
    per_request = WORKLOADS[workload]
    ok_per_s = load.ok / load.seconds
    return Point(
        system,
        workload,
        users,
        repeat,
        sentences_per_s=ok_per_s * per_request,
        requests_per_s=ok_per_s,
        p50_ms=load.p50_ms,
        p99_ms=load.p99_ms,
        requests=load.requests,
        failures=load.failed,
        shed=load.shed,
        loadgen_cpu_share=load.loadgen_cpu_s / (load.seconds * loadgen.cores()),
        cpu_ms_per_request=cpu.per_request(before, after, load.ok),
    )


def drain(url: str, timeout_s: float = 120) -> float:
    """Wait until the server has worked off what the last point left queued (a client that stops
    does not take back the requests it had sent): a one-sentence request must answer in 0.5 s."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        sent = time.monotonic()
        try:
            with urllib.request.urlopen(
                urllib.request.Request(
                    f"{url}/embed",
                    data=b'{"texts": ["drain"]}',
                    headers={"content-type": "application/json"},
                ),
                timeout=30,
            ) as resp:
                if resp.status == 200 and time.monotonic() - sent < 0.5:
                    return time.monotonic() - started
        except OSError:
            pass
        time.sleep(0.5)
    return time.monotonic() - started
