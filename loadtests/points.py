"""One load point: wrk against a server for a few seconds, read back as a ``Point`` with the CPU
each server process spent per request.

The workloads, the user counts of a run and the names of the systems compared are defined here, so
the benchmark, its report and the tests share them.
"""

from __future__ import annotations

import http.client
import os
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from loadtests import cpu, loadgen
from loadtests.processes import ROOT, Server

OUT = Path(os.environ.get("BENCH_OUT", ROOT / "build" / "bench"))
QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
WORKLOADS = {"chat": 1, "bulk": loadgen.BULK}  # sentences per request (/embed)
# /classify, one text per request, for a demo tenant drawn Zipf-style (s = 1.1) from TENANTS: head
# tenants on the stack's own tenant store, whole models on a second graph's (make tenants-mixed).
CLASSIFY = "classify"
TENANTS = int(os.environ.get("BENCH_TENANTS") or (16 if QUICK else 1000))
# One user (what batching costs when there is nothing to batch), then the ramp from 16 to 160.
# A quick run (CI) keeps the points short and light.
USERS = (1, 8) if QUICK else (1, 16, 64, 160)
MIDDLE = USERS[-1] if QUICK else 64
# Bulk, /classify and the encodings' points run longer: at 64 users a one-request-at-a-time server answers a bulk request in
# ~11 s, so a 10 s point would complete none (seen in the first full run).
BULK_LONGER = 3
STACK, INT8, NOBATCH, FASTAPI, NAIVE, HANDWRITTEN = (
    "stack",
    "stack, int8",
    "stack, batching off",
    "fastapi",
    "naive bentoml",
    "hand-written batching",
)
SYSTEMS = (STACK, INT8, NOBATCH, FASTAPI, NAIVE, HANDWRITTEN)
HEADS, MODELS = "stack, head tenants", "stack, per-tenant models"
# The same graph with its hot routes traced: both services' routes on BentoML's own stack,
# what the lean path (serving/hot_path.py) is measured against, once with the access log off (the
# cost of the tracing setting alone) and once with it on. (The tokenizer still calls the runner
# on its lean hop client, services/tokenizer/hop.py, not BentoML's: that part is in all three.)
TRACED_PATH = "stack, traced"
BENTOML_PATH = "stack, BentoML's path"
TRACING = {"BUNDLE_TOKENIZER_TRACE_REQUESTS": "true", "BUNDLE_ONNX_TRACE_REQUESTS": "true"}
TRACED = {**TRACING, "BUNDLE_TOKENIZER_ACCESS_LOG": "true"}
PATH_SYSTEMS = (STACK, TRACED_PATH, BENTOML_PATH)
TENANT_SYSTEMS = (HEADS, MODELS)
# How /embed sends vectors back: measured on the stack, bulk, at MIDDLE users.
ENCODINGS = ("float", "base64")


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
    encoding: str = ""  # the vectors' encoding asked for ("": the default, float)
    # Servers restarted just before this point: they had not worked off an earlier point's queue
    # (loadtests.bench.settle); the report counts them.
    restarted: list[str] = field(default_factory=list)


def bodies(workload: str, backend: str, encoding: str = "") -> Path:
    if workload == CLASSIFY:
        return loadgen.write_classify_bodies(OUT / "bodies" / f"classify-{TENANTS}.jsonl", TENANTS)
    name = "-".join(filter(None, (workload, backend or "default", encoding)))
    return loadgen.write_bodies(
        workload, OUT / "bodies" / f"{name}.jsonl", backend=backend, encoding=encoding
    )


def response_bytes(url: str, body_file: Path, samples: int = 20) -> float:
    """Mean size of /embed's response body over the first ``samples`` bodies of a file."""
    sizes = []
    for line in body_file.read_text().splitlines()[:samples]:
        request = urllib.request.Request(
            f"{url}/embed", data=line.encode(), headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            sizes.append(len(resp.read()))
    return sum(sizes) / len(sizes)


def measure(
    server: Server, processes_first: bool
) -> tuple[dict[int, tuple[str, cpu.Usage]], dict[str, float]]:
    """Every process's CPU (/proc) and the runners' engine CPU (their counter on ``/metrics``),
    one right after the other. Before a load, the counter first and after it, /proc first: the
    ``/metrics`` request's own CPU falls outside the load's window either way. At the load's end
    the runner is still working off the requests in flight, so the two moments differ by what its
    lanes do between them: a call running at the /proc snapshot and not ended by the counter's
    read is in /proc only (against the runner), one that ends in between has CPU after the
    snapshot in the counter (for it). Either way, at most the lanes' current calls."""
    if processes_first:
        processes = cpu.snapshot([server.process(), *server.descendants()])
        return processes, cpu.engine_seconds(server.url)
    engine = cpu.engine_seconds(server.url)
    return cpu.snapshot([server.process(), *server.descendants()]), engine


def point(
    server: Server,
    system: str,
    workload: str,
    users: int,
    seconds: float,
    repeat: int = 0,
    backend: str = "",
    encoding: str = "",
    restarted: list[str] | None = None,
) -> Point:
    path = "/classify" if workload == CLASSIFY else "/embed"
    before, engine_before = measure(server, processes_first=False)
    load = loadgen.run(server.url, path, bodies(workload, backend, encoding), users, seconds)
    after, engine_after = measure(server, processes_first=True)
    per_request = WORKLOADS.get(workload, 1)
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
        cpu_ms_per_request=cpu.per_request(before, after, load.ok, (engine_before, engine_after)),
        encoding=encoding,
        restarted=list(restarted or []),
    )


def drain(url: str, timeout_s: float = 120) -> bool:
    """Wait until the server has worked off what the last point left queued (a client that stops
    does not take back the requests it had sent): a one-sentence request must answer in 0.5 s.
    False if none did within ``timeout_s``. A request's socket waits are cut at the deadline
    (urllib's timeout bounds each connect and read, not the whole request)."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        sent = time.monotonic()
        try:
            with urllib.request.urlopen(
                urllib.request.Request(
                    f"{url}/embed",
                    data=b'{"texts": ["drain"]}',
                    headers={"content-type": "application/json"},
                ),
                timeout=min(30.0, left),
            ) as resp:
                if resp.status == 200 and time.monotonic() - sent < 0.5:
                    return True
        except (OSError, http.client.HTTPException):  # refused, reset, timed out, cut short
            pass
        time.sleep(max(0.0, min(0.5, deadline - time.monotonic())))
    return False
