"""One load point: a headless Locust run against a server, read back as a ``Point``.

The workloads (``WORKLOADS``), the user counts of a run (``USERS``) and the names of the systems
compared are defined here, so the benchmark, its report and the tests share them.
"""

from __future__ import annotations

import csv
import os
import resource
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from loadtests.processes import BIN, ROOT

OUT = Path(os.environ.get("BENCH_OUT", ROOT / "build" / "bench"))
WORKLOADS = {"chat": ("ChatUser", 1), "bulk": ("BulkUser", 32)}
# The full run ramps as seed 000 does. A quick run (CI) uses lighter loads: in a closed loop, bulk
# at 160 users means ~10 s latency, longer than a quick point lasts, so nothing would complete.
USERS = (4, 8, 16) if os.environ.get("BENCH_QUICK", "") not in ("", "0") else (16, 64, 160)
MIDDLE = USERS[1]
STACK, NOBATCH, INT8, FASTAPI, NAIVE = (
    "stack",
    "stack, batching off",
    "stack, int8",
    "fastapi",
    "naive bentoml",
)
SYSTEMS = (STACK, INT8, NOBATCH, FASTAPI, NAIVE)


@dataclass
class Point:
    system: str
    workload: str
    users: int
    sentences_per_s: float
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    requests: int  # not shed (served, or failed otherwise)
    failures: int  # of those, failed (wrong answer, 5xx other than 503)
    shed: int  # refused with 429/503 + Retry-After (the users then back off)
    loadgen_cpu_share: float  # Locust's CPU seconds / (wall seconds x cores)


def locust_point(
    url: str, system: str, workload: str, users: int, seconds: float, backend: str = ""
) -> Point:
    user_class, per_request = WORKLOADS[workload]
    prefix = OUT / "locust" / f"{system.replace(' ', '_').replace(',', '')}-{workload}-{users}"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        str(BIN / "locust"), "-f", "loadtests/locustfile.py", user_class, "--headless",
        "-u", str(users), "-r", str(users), "-t", f"{seconds + 1:.0f}s", "--reset-stats",
        "--host", url, "--csv", str(prefix), "--only-summary", "--max-fail-ratio", "1",
    ]  # fmt: skip
    if backend:
        argv += ["--backend", backend]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:
        with open(f"{prefix}_stats.csv") as fh:
            rows = list(csv.DictReader(fh))
        total = next(row for row in rows if row["Name"] == "Aggregated")
    except (OSError, StopIteration):
        raise RuntimeError(
            f"locust produced no stats for {system}/{workload}/{users}: {proc.stderr[-1500:]}"
        ) from None
    served_rows = [
        r for r in rows if r["Name"] != "Aggregated" and not r["Name"].endswith("[shed]")
    ]
    shed = sum(int(r["Request Count"]) for r in rows if r["Name"].endswith("[shed]"))
    served = (
        served_rows[0]
        if served_rows
        else {"Request Count": "0", "Failure Count": "0", "50%": "N/A", "99%": "N/A"}
    )
    count, failed = int(served["Request Count"]), int(served["Failure Count"])
    # Locust's Requests/s counts failures and shed requests too: scale it to the successful ones.
    total_count = int(total["Request Count"])
    ok_rps = float(total["Requests/s"]) * (count - failed) / total_count if total_count else 0.0
    return Point(
        system, workload, users,
        sentences_per_s=ok_rps * per_request, requests_per_s=ok_rps,
        p50_ms=_number(served["50%"]), p99_ms=_number(served["99%"]),
        requests=count, failures=failed, shed=shed,
        loadgen_cpu_share=cpu / (wall * (os.cpu_count() or 1)),
    )  # fmt: skip


def _number(cell: str) -> float:
    try:
        return float(cell)
    except ValueError:  # "N/A": no request completed in the window
        return float("nan")


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
