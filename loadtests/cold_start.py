"""Cold start: from a start of the whole graph (``bentoml serve .``) to ready and to its first correct
answer, that answer against the steady state, the graph at rest; then each of ``ALONE`` by itself.
``--images`` instead measures each image's container (loadtests/cold_start_images.py) and adds
them to the graph's last record: ``make cold-start`` runs the graph first, with no Docker engine
running, then starts one for the images.

    python -m loadtests.cold_start [--starts 5] [--steady 30] [--idle 10] [--record] [--images]

A correct answer is the one the same server gives once warm. Each service logs its start in parts
(serving/startup.py), read from the server's log. At rest, each service's first worker and BentoML's
supervisor are watched for ``--idle`` seconds. Medians over the starts; ``--record`` writes them to
loadtests/results/cold-start/DATE.json (make cold-start), which loadtests/README.md quotes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from loadtests import cpu
from loadtests.bench import commit, record_meta
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

    def counts(pid: int) -> tuple[float, int]:
        used = cpu.usage(pid)
        return used.main_s + used.other_s, cpu.wakeups(pid)

    before = {name: counts(proc.pid) for name, proc in procs.items()}
    time.sleep(seconds)
    after = {name: counts(proc.pid) for name, proc in procs.items()}
    return {
        name: {"cpu_share": round((after[name][0] - before[name][0]) / seconds, 4),
               "wakeups_per_s": round((after[name][1] - before[name][1]) / seconds, 1),
               "rss_mb": round(proc.memory_info().rss / 2**20, 1)}
        for name, proc in procs.items()
    }  # fmt: skip


def until_200(server: Server, launched: float, send: Callable[[], httpx.Response]) -> Any:
    """Send until the answer is a 200: its JSON (None for /readyz's text), and the seconds from
    ``launched`` (``time.monotonic``)."""
    while time.monotonic() - launched < LIMIT_S:
        server.descendants()  # remembered now: a server that dies while starting orphans them
        if server.proc is not None and server.proc.poll() is not None:
            raise RuntimeError(f"the server exited while starting:\n{server.tail()}")
        try:
            resp = send()
            if resp.status_code == 200:
                body = resp.json() if "json" in resp.headers.get("content-type", "") else None
                return body, time.monotonic() - launched
        except httpx.TransportError:
            pass
        time.sleep(POLL_S)
    raise TimeoutError(f"no answer after {LIMIT_S} s:\n{server.tail()}")


def embed(client: httpx.Client) -> tuple[np.ndarray, float]:
    started = time.perf_counter()
    resp = client.post("/embed", json={"texts": [TEXT]}, timeout=30).raise_for_status()
    return np.asarray(resp.json()["embeddings"][0], np.float32), time.perf_counter() - started


def logged(server: Server, launched_at: float) -> dict[str, dict[str, float]]:
    """Each service's start as it logged it, its start and ready as seconds after the launch."""
    return {
        r["service"]: {
            "started_s": round(r["started_at"] - launched_at, 3),
            **{k: r[k] for k in ("import_s", "load_s", "warm_up_s", "total_s")},
            "ready_s": round(r["ready_at"] - launched_at, 3),
        }
        for r in parse(server.log.read_text(errors="replace"))
    }


def one_start(index: int, steady: int, idle: float) -> dict[str, Any]:
    """Launch the graph, time it to ready and to its first correct answer, watch it at rest, stop
    it."""
    server = bentoml_serve(".", log_path(f"cold-start-{index}.log"))
    launched_at, launched = time.time(), time.monotonic()
    server.launch()
    try:
        with httpx.Client(base_url=server.url) as client:
            ready_s = until_200(server, launched, lambda: client.get("/readyz", timeout=2))[1]
            first, first_latency = embed(client)
            answered_s = time.monotonic() - launched
            latencies, vector = [], first
            for _ in range(steady):
                vector, latency = embed(client)
                latencies.append(latency)
        diff = float(np.max(np.abs(first - vector)))
        if diff > MAX_ABS_DIFF:
            raise AssertionError(f"the first answer is off the warm one by {diff:.1e}")
        services = logged(server, launched_at)
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
RUNNERS = {"ONNX": "runners.onnx.service:OnnxRunner", "TF": "runners.tf.service:TFRunner",
           "TENANT": "runners.tenants.service:TenantRunner"}  # fmt: skip
IDS = [[101, 2129, 2079, 1045, 25141, 2026, 20786, 1029, 102]]  # TEXT by MiniLM's tokenizer
ALONE: dict[str, tuple[str, str, dict[str, Any]]] = {
    "tokenizer": ("services.tokenizer.service:Tokenizer", "/tokenize", {"texts": [TEXT]}),
    "onnx_runner": (RUNNERS["ONNX"], "/embed", {"ids": IDS}),
}


def alone(index: int, name: str, env: dict[str, str]) -> dict[str, Any]:
    """One service by itself: seconds from launch to its first correct answer (the answer it
    gives once warm), and its start's parts."""
    target, route, body = ALONE[name]
    server = bentoml_serve(target, log_path(f"cold-start-{name}-{index}.log"), env)
    launched = time.monotonic()
    server.launch()
    try:
        with httpx.Client(base_url=server.url) as client:
            post = lambda: client.post(route, json=body, timeout=5)  # noqa: E731
            first, answered_s = until_200(server, launched, post)
            # Ready: its log has its parts.
            ready_s = until_200(server, launched, lambda: client.get("/readyz", timeout=2))[1]
            warm = client.post(route, json=body, timeout=5).json()
        timings = [k for k in warm if k.endswith("_ms")]
        if {**first, **dict.fromkeys(timings)} != {**warm, **dict.fromkeys(timings)}:
            raise AssertionError(f"{name}'s first answer differs from its warm one")
        parts = logged(server, 0.0).get(name, {})
    finally:
        server.stop()
    own: dict[str, float] = {k: parts[k] for k in ("import_s", "load_s", "warm_up_s") if k in parts}
    return {"first_answer_s": round(answered_s, 3), "ready_s": round(ready_s, 3), **own}


def repeated(label: str, starts: int, one: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
    """``one(index)`` for each start, each printed as it ends; the runs and their medians."""
    runs = []
    for index in range(starts):
        runs.append(one(index))
        print(f"{label} {index + 1}/{starts}: {json.dumps(runs[-1])}", flush=True)
    return {"starts": runs, "median": medians(runs)}


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the runs; a figure that is a dict (by service), each of its own."""
    out: dict[str, Any] = {}
    for key, first in runs[0].items():
        values = [r[key] for r in runs if key in r]
        if isinstance(first, dict):
            names = sorted({n for v in values for n in v})
            out[key] = {n: medians([v[n] for v in values if n in v]) for n in names}
        else:
            out[key] = round(statistics.median(values), 4)
    return out


def table(title: str, heads: list[str], rows: dict[str, dict], unit: str = "") -> list[str]:
    lines = ["", f"| {title} | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    return lines + [f"| {name} | " + " | ".join(f"{v}{unit}" for v in row.values()) + " |"
                    for name, row in rows.items()]  # fmt: skip


def render(result: dict[str, Any]) -> str:
    m = result["median"]
    lines = [
        f"graph (`bentoml serve .`), median of {len(result['starts'])} starts: ready "
        f"{m['ready_s']} s, first correct answer {m['first_answer_s']} s; first answer "
        f"{m['first_ms']} ms against a steady p50 of {m['steady_p50_ms']} ms, steady p90 "
        f"{m['steady_p90_ms']} ms (each start's first over its p50: median "
        f"{m['first_over_steady']}x)",
    ]
    parts = ["process started", "import", "model load", "warm-up", "start total", "ready"]
    lines += table("service", parts, m["services"], " s")
    alone = {name: found["median"] for name, found in result.get("alone", {}).items()}
    lines += table("service alone", ["first correct answer", "ready", *parts[1:4]], alone, " s")
    rest = ["CPU (share of a core)", "wake-ups per second", "resident MB"]
    lines += table("at rest", rest, m["at_rest"])
    if images := {name: found["median"] for name, found in result.get("images", {}).items()}:
        heads = ["container started", "worker started", "import", "model load", "warm-up",
                 "ready", "first correct answer", "first ms", "steady p50 ms", "first / p50"]  # fmt: skip
        lines += table("image (from its launch, s)", heads, images)
    return "\n".join(lines)


def run(starts: int, steady: int, idle: float, services: bool = True) -> dict[str, Any]:
    measured = commit()  # the code the servers start with, not what the tree holds at the end
    graph = repeated("start", starts, lambda index: one_start(index, steady, idle))
    by_itself: dict[str, Any] = {}
    if services:
        alone_in = lambda name, env: lambda index: alone(index, name, env)  # noqa: E731
        by_itself["onnx_runner"] = repeated(
            "onnx_runner alone", starts, alone_in("onnx_runner", {})
        )
        runners = {
            kind: bentoml_serve(target, log_path(f"cold-start-runner-{kind.lower()}.log"))
            for kind, target in RUNNERS.items()
        }
        with Servers(runners) as up:
            urls = {f"BUNDLE_TOKENIZER_{kind}_URL": s.url for kind, s in up.items()}
            by_itself["tokenizer"] = repeated(
                "tokenizer alone", starts, alone_in("tokenizer", urls)
            )
    command = "python -m loadtests.cold_start " + " ".join(sys.argv[1:])
    meta = {**record_meta(measured), "command": command}
    return {"meta": meta, **graph, "alone": by_itself}


def with_images(result: dict[str, Any], starts: int, steady: int) -> dict[str, Any]:
    """``result`` (a record of the graph) with each image's starts and their medians added, and
    how and on what code they were measured."""
    from loadtests import cold_start_images

    measured = commit()
    found = cold_start_images.measure(list(cold_start_images.IMAGES), starts, steady=steady)
    images = {name: {"starts": runs, "median": medians(runs)} for name, runs in found.items()}
    command = "python -m loadtests.cold_start " + " ".join(sys.argv[1:])
    meta = {**result["meta"], "images": {**record_meta(measured), "command": command}}
    return {**result, "meta": meta, "images": images}


# Where the graph's last recorded run is, for ``--images`` to add to: named by its date, which a
# run that ends after midnight (UTC) does not share with the images' step.
LAST = ROOT / "build" / "cold-start" / "graph-record"


def graph_record(measured: str) -> Path:
    """The record the graph's last ``--record`` run wrote, which ``--images`` adds to: refused if
    there is none, or if it was measured at another commit than ``measured`` (the record itself
    leaves the tree changed, so only the commits are compared)."""
    if not LAST.exists() or not (recorded := Path(LAST.read_text().strip())).exists():
        raise SystemExit("error: no recorded run of the graph to add the images to: run it first")
    graph = json.loads(recorded.read_text())["meta"]["commit"]
    if graph.split("+")[0] != measured.split("+")[0]:
        raise SystemExit(f"error: {recorded} was measured on {graph}, this tree is {measured}")
    return recorded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--steady", type=int, default=30, help="answers after the first")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds watched at rest")
    parser.add_argument("--record", action="store_true", help="write loadtests/results/")
    parser.add_argument(
        "--images",
        action="store_true",
        help="each image instead, added to the graph's last record (a Docker engine, `make images`)",
    )
    args = parser.parse_args(argv)
    if args.images:
        path = graph_record(commit())
        result = with_images(json.loads(path.read_text()), args.starts, args.steady)
    else:
        result = run(args.starts, args.steady, args.idle)
        path = RESULTS / f"{result['meta']['date'][:10]}.json"
    print(render(result))
    if args.record:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        LAST.parent.mkdir(parents=True, exist_ok=True)
        LAST.write_text(f"{path}\n")
        print(f"recorded in {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
