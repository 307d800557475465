"""Cold start: from a start of the whole graph (``bentoml serve .``) to ready and to its first correct
answer, and what that first answer cost against the steady state, over several starts.

    python -m loadtests.cold_start [--starts 5] [--steady 30] [--idle 10] [--record]
                                                                             (make cold-start)

For each start: the seconds from launching ``bentoml serve`` to /readyz answering 200 (the graph's
readiness waits for every runner's), to the first /embed answered correctly, that first answer's
latency, and the median of ``--steady`` answers after it. A correct answer is the vector the same
server gives once warm, for the same text. Each service logs its own start in three parts
(serving/startup.py): import (from the process's start to its ``__init__``), model load, warm-up;
they are read from the server's log. Then the graph rests: after ``REST_S``, each service's worker is
watched for ``--idle`` seconds (its first worker, and BentoML's supervisor): CPU, wake-ups (context
switches of all its threads) per second, and resident memory. The figures reported are each one's median over the starts;
``--record`` writes them to loadtests/results/cold-start/DATE.json, which loadtests/README.md
quotes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

import httpx
import numpy as np

from loadtests import cpu
from serving.startup import parse
from testkit.processes import ROOT, Server, Servers, bentoml_serve, log_path

TEXT = "How do I reset my password?"
POLL_S = 0.02  # readiness is polled this often: a finer grain than any start measured here
LIMIT_S = 180.0  # a start that is not ready by then fails the run
MAX_ABS_DIFF = 1e-5
# A folder of its own: the benchmark reads every JSON directly in loadtests/results as its records.
RESULTS = ROOT / "loadtests" / "results" / "cold-start"
REST_S = 3.0  # after the last answer, before idle is watched: keep-alive and lingering work end


def at_rest(server: Server, services: list[str], seconds: float) -> dict[str, dict[str, float]]:
    """Each service's worker (and BentoML's supervisor) over ``seconds`` with no request: CPU
    share of one core, wake-ups per second, resident MB at the end."""
    procs = {name: cpu.workers(server, name)[0] for name in services}
    procs["supervisor"] = server.process()
    before = {n: (cpu.usage(p.pid), cpu.wakeups(p.pid)) for n, p in procs.items()}
    time.sleep(seconds)
    out = {}
    for name, proc in procs.items():
        (used, woke), now = before[name], cpu.usage(proc.pid)
        busy = now.main_s + now.other_s - used.main_s - used.other_s
        out[name] = {
            "cpu_share": round(busy / seconds, 4),
            "wakeups_per_s": round((cpu.wakeups(proc.pid) - woke) / seconds, 1),
            "rss_mb": round(proc.memory_info().rss / 2**20, 1),
        }
    return out


def first_ready(client: httpx.Client, launched: float, server: Server) -> float:
    """Seconds from ``launched`` (``time.monotonic``) until /readyz answers 200."""
    while time.monotonic() - launched < LIMIT_S:
        server.descendants()  # remembered now: a server that dies while starting orphans them
        if server.proc is not None and server.proc.poll() is not None:
            raise RuntimeError(f"the server exited while starting:\n{server.tail()}")
        try:
            if client.get("/readyz", timeout=2).status_code == 200:
                return time.monotonic() - launched
        except httpx.TransportError:
            pass
        time.sleep(POLL_S)
    raise TimeoutError(f"not ready after {LIMIT_S} s:\n{server.tail()}")


def embed(client: httpx.Client) -> tuple[np.ndarray, float]:
    started = time.perf_counter()
    resp = client.post("/embed", json={"texts": [TEXT]}, timeout=30)
    latency = time.perf_counter() - started
    resp.raise_for_status()
    return np.asarray(resp.json()["embeddings"][0], dtype=np.float32), latency


def one_start(index: int, steady: int, idle: float) -> dict[str, Any]:
    """Launch the graph, time it to ready and to its first correct answer, watch it at rest, stop
    it."""
    server = bentoml_serve(".", log_path(f"cold-start-{index}.log"))
    launched_at = time.time()
    launched = time.monotonic()
    server.launch()
    try:
        with httpx.Client(base_url=server.url) as client:
            ready_s = first_ready(client, launched, server)
            first, first_latency = embed(client)
            answered_s = time.monotonic() - launched
            latencies, vector = [], first
            for _ in range(steady):
                vector, latency = embed(client)
                latencies.append(latency)
        diff = float(np.max(np.abs(first - vector)))
        if diff > MAX_ABS_DIFF:
            raise AssertionError(f"the first answer is off the warm one by {diff:.1e}")
        services = {}
        for record in parse(server.log.read_text(errors="replace")):
            services[record["service"]] = {
                "started_s": round(record["started_at"] - launched_at, 3),
                **{k: record[k] for k in ("import_s", "load_s", "warm_up_s", "total_s")},
                "ready_s": round(record["ready_at"] - launched_at, 3),
            }
        time.sleep(REST_S)
        rest = at_rest(server, sorted(services), idle)
    finally:
        server.stop()
    steady_p50 = statistics.median(latencies)
    steady_p90 = statistics.quantiles(latencies, n=10)[-1]
    return {
        "ready_s": round(ready_s, 3),
        "first_answer_s": round(answered_s, 3),
        "first_ms": round(first_latency * 1000, 1),
        "steady_p50_ms": round(steady_p50 * 1000, 1),
        "steady_p90_ms": round(steady_p90 * 1000, 1),
        "first_over_steady": round(first_latency / steady_p50, 2),
        "services": services,
        "at_rest": rest,
    }


# A service started by itself, as its container starts it: its route polled from launch until it
# answers. The tokenizer's runners are URLs (BentoML reads each one's schema as the tokenizer
# starts, so they are up first, as in the compose stack); /tokenize needs none of them.
ALONE: dict[str, tuple[str, str, dict[str, Any]]] = {
    "tokenizer": ("services.tokenizer.service:Tokenizer", "/tokenize", {"texts": [TEXT]}),
    "onnx_runner": (
        "runners.onnx.service:OnnxRunner",
        "/embed",
        {"ids": [[101, 2129, 2079, 1045, 25141, 2026, 20786, 1029, 102]]},
    ),
}
RUNNERS = {
    "ONNX": "runners.onnx.service:OnnxRunner",
    "TF": "runners.tf.service:TFRunner",
    "TENANT": "runners.tenants.service:TenantRunner",
}


def answer(body: dict[str, Any]) -> str:
    """An answer without its timings (``*_ms``), comparable as text."""
    return json.dumps({k: v for k, v in body.items() if not k.endswith("_ms")}, sort_keys=True)


def alone(index: int, name: str, env: dict[str, str]) -> dict[str, Any]:
    """One service by itself: seconds from launch to its first correct answer (the answer it
    gives once warm), and its start's parts."""
    target, route, body = ALONE[name]
    server = bentoml_serve(target, log_path(f"cold-start-{name}-{index}.log"), env)
    launched = time.monotonic()
    server.launch()
    try:
        with httpx.Client(base_url=server.url) as client:
            first = None
            while first is None and time.monotonic() - launched < LIMIT_S:
                server.descendants()  # remembered now, as in first_ready
                if server.proc is not None and server.proc.poll() is not None:
                    raise RuntimeError(f"{name} exited while starting:\n{server.tail()}")
                try:
                    resp = client.post(route, json=body, timeout=5)
                    if resp.status_code == 200:
                        first = resp.json()
                        continue
                except httpx.TransportError:
                    pass
                time.sleep(POLL_S)
            answered_s = time.monotonic() - launched
            if first is None:
                raise TimeoutError(f"{name} did not answer within {LIMIT_S} s:\n{server.tail()}")
            ready_s = first_ready(client, launched, server)  # and its log has its parts
            warm = client.post(route, json=body, timeout=5).json()
        if answer(first) != answer(warm):
            raise AssertionError(f"{name}'s first answer differs from its warm one")
        records = [r for r in parse(server.log.read_text(errors="replace")) if r["service"] == name]
    finally:
        server.stop()
    parts = {k: records[0][k] for k in ("import_s", "load_s", "warm_up_s")} if records else {}
    return {"first_answer_s": round(answered_s, 3), "ready_s": round(ready_s, 3), **parts}


def alone_starts(name: str, starts: int, env: dict[str, str]) -> dict[str, Any]:
    runs = []
    for index in range(starts):
        runs.append(alone(index, name, env))
        print(f"{name} alone {index + 1}/{starts}: {json.dumps(runs[-1])}", flush=True)
    median = {key: round(statistics.median(r[key] for r in runs), 3) for key in runs[0]}
    return {"starts": runs, "median": median}


def medians(starts: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the starts (a service's parts over the starts that logged it)."""
    top = (
        "ready_s",
        "first_answer_s",
        "first_ms",
        "steady_p50_ms",
        "steady_p90_ms",
        "first_over_steady",
    )
    out: dict[str, Any] = {k: round(statistics.median(s[k] for s in starts), 3) for k in top}
    for part in ("services", "at_rest"):
        out[part] = {}
        for name in sorted({n for s in starts for n in s[part]}):
            runs = [s[part][name] for s in starts if name in s[part]]
            out[part][name] = {
                key: round(statistics.median(r[key] for r in runs), 4) for key in runs[0]
            }
    return out


def render(result: dict[str, Any]) -> str:
    m = result["median"]
    lines = [
        f"graph (`bentoml serve .`), median of {len(result['starts'])} starts: ready "
        f"{m['ready_s']} s, first correct answer {m['first_answer_s']} s; first answer "
        f"{m['first_ms']} ms against a steady p50 of {m['steady_p50_ms']} ms, steady p90 "
        f"{m['steady_p90_ms']} ms (each start's first over its p50: median "
        f"{m['first_over_steady']}x)",
        "",
        "| service | process started | import | model load | warm-up | start total | ready |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in m["services"].items():
        lines.append(
            f"| {name} | {s['started_s']} s | {s['import_s']} s | {s.get('load_s', 0)} s | "
            f"{s.get('warm_up_s', 0)} s | {s['total_s']} s | {s['ready_s']} s |"
        )
    if result.get("alone"):
        lines += [
            "",
            "| service alone | first correct answer | ready | import | model load | warm-up |",
            "|---|---|---|---|---|---|",
        ]
        for name, found in result["alone"].items():
            a = found["median"]
            lines.append(
                f"| {name} | {a['first_answer_s']} s | {a['ready_s']} s | {a.get('import_s')} s | "
                f"{a.get('load_s')} s | {a.get('warm_up_s')} s |"
            )
    lines += [
        "",
        "| at rest | CPU (share of a core) | wake-ups per second | resident MB |",
        "|---|---|---|---|",
    ]
    for name, r in m["at_rest"].items():
        lines.append(f"| {name} | {r['cpu_share']} | {r['wakeups_per_s']} | {r['rss_mb']} |")
    return "\n".join(lines)


def run(starts: int, steady: int, idle: float, services: bool = True) -> dict[str, Any]:
    runs = []
    for index in range(starts):
        runs.append(one_start(index, steady, idle))
        print(f"start {index + 1}/{starts}: {json.dumps(runs[-1])}", flush=True)
    by_itself: dict[str, Any] = {}
    if services:
        by_itself["onnx_runner"] = alone_starts("onnx_runner", starts, {})
        runners = {
            kind: bentoml_serve(target, log_path(f"cold-start-runner-{kind.lower()}.log"))
            for kind, target in RUNNERS.items()
        }
        with Servers(runners) as up:
            urls = {f"BUNDLE_TOKENIZER_{kind}_URL": s.url for kind, s in up.items()}
            by_itself["tokenizer"] = alone_starts("tokenizer", starts, urls)
    return {
        "meta": {
            "date": datetime.date.today().isoformat(),
            "host": platform.node(),
            "cores": os.cpu_count(),
            "command": "python -m loadtests.cold_start " + " ".join(sys.argv[1:]),
        },
        "starts": runs,
        "median": medians(runs),
        "alone": by_itself,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--steady", type=int, default=30, help="answers after the first")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds watched at rest")
    parser.add_argument("--record", action="store_true", help="write loadtests/results/")
    args = parser.parse_args(argv)
    result = run(args.starts, args.steady, args.idle)
    print(render(result))
    if args.record:
        path = RESULTS / f"{result['meta']['date']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"recorded in {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
