"""The side-by-side benchmark (``make bench``; ``BENCH_QUICK=1`` for a few seconds a point).

In one run, on one machine, with the same Locust client and corpus for every system:
- raw: the engine in this process (tokenize + ONNX session, length-sorted batches of the best
  size), no HTTP at all: the limit;
- stack: this project (``bentoml serve .``), fp32, and the same server with backend onnx-int8;
- stack, batching off: the same graph with one sequence per engine call;
- fastapi: seed 003's FastAPI + ONNX Runtime server, one request at a time;
- naive bentoml: ``batchable=True`` on ``list[list[int]]``, padded to the longest.
Servers run one at a time. Prints a markdown table and writes build/bench/results.json, results.md
and a PNG per workload (throughput, p50 and p99 against users).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
from dataclasses import asdict

from loadtests.points import (
    FASTAPI,
    INT8,
    MIDDLE,
    NAIVE,
    NOBATCH,
    OUT,
    STACK,
    USERS,
    WORKLOADS,
    Point,
    drain,
    locust_point,
)
from loadtests.processes import BIN, Server, bentoml_serve, free_port
from loadtests.raw_engine import raw_engine
from loadtests.report import markdown, plot, ratios, targets


def servers() -> dict[str, Server]:
    logs = OUT / "logs"
    port = free_port()
    fastapi = Server(
        [str(BIN / "uvicorn"), "loadtests.baselines.fastapi_server:app", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        port, logs / "fastapi.log", ready_path="/health",
    )  # fmt: skip
    return {
        STACK: bentoml_serve(".", logs / "stack.log"),
        NOBATCH: bentoml_serve(".", logs / "nobatch.log", env={"BUNDLE_ONNX_MAX_BATCH_ROWS": "1"}),
        FASTAPI: fastapi,
        NAIVE: bentoml_serve("loadtests.baselines.naive_bentoml:NaiveFront", logs / "naive.log"),
    }


def main() -> int:
    quick = os.environ.get("BENCH_QUICK", "") not in ("", "0")
    seconds = float(os.environ.get("BENCH_SECONDS", 4 if quick else 30))
    OUT.mkdir(parents=True, exist_ok=True)
    from serving import contracts

    print(
        f"benchmark: {'quick, ' if quick else ''}{seconds:.0f} s a point, users {USERS}", flush=True
    )
    raw = {
        "fp32": raw_engine(contracts.ONNX_FP32, 1 if quick else 3),
        "int8": raw_engine(contracts.ONNX_INT8, 1 if quick else 3),
    }
    print(
        f"raw engine: {raw['fp32']['sentences_per_s']:.0f} sentences/s (fp32), {raw['int8']['sentences_per_s']:.0f} (int8)",
        flush=True,
    )
    points: list[Point] = []
    for system, server in servers().items():
        with server:
            for workload in WORKLOADS:
                for users in USERS:
                    runs = [(system, "")]
                    if system == STACK and users == MIDDLE:  # int8 on the same server, same load
                        runs.append((INT8, "onnx-int8"))
                    for name, backend in runs:
                        drain(server.url)
                        point = locust_point(server.url, name, workload, users, seconds, backend)
                        points.append(point)
                        print(
                            f"  {name:<20} {workload:<5} {users:>3} users: {point.sentences_per_s:7.1f} sentences/s, "
                            f"p50 {point.p50_ms:.0f} ms, p99 {point.p99_ms:.0f} ms, {point.failures} failures",
                            flush=True,
                        )
    rows = ratios(points, raw["fp32"]["sentences_per_s"])
    table = markdown(points, rows, raw)
    checks = targets(rows, points)
    meta = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.processor() or platform.platform()}",
        "python": sys.version.split()[0],
        "quick": quick,
        "seconds_per_point": seconds,
        "users": list(USERS),
        "middle_users": MIDDLE,
    }
    results = {"meta": meta, "raw": raw, "points": [asdict(p) for p in points], "ratios": rows,
               "targets": [{"target": t, "met": ok, "measured": m} for t, ok, m in checks]}  # fmt: skip
    (OUT / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (OUT / "results.md").write_text(table + "\n")
    plots = plot(points, raw["fp32"]["sentences_per_s"])
    print("\n" + table + "\n")
    for target, ok, measured in checks:
        print(f"{'met   ' if ok else 'MISSED'} {target}: {measured}")
    print(
        f"\nwritten: {OUT / 'results.json'}, {OUT / 'results.md'}, "
        + ", ".join(str(p) for p in plots)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
