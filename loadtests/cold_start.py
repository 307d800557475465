"""Cold start: the whole graph (``bentoml serve .``) from its launch to ready and to its first
correct answer (the one it gives once warm: ``same``), that answer against the steady state, each
service's start in parts as it logged it (serving/startup.py), the graph at rest; ``--images``
instead each image's container (``measure``: a Docker engine, Debian's client first on PATH, and
``make images`` tagged ``IMAGE_TAG``, default latest), added to the graph's last record.

    python -m loadtests.cold_start [--starts 5] [--steady 30] [--idle 10] [--record] [--images]

What it measures, in what order, and what ``--record`` writes (the medians over the starts, to
loadtests/results/cold-start/DATE.json): loadtests/README.md, "make cold-start".
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from loadtests import cpu
from loadtests.bench import commit, record_meta, write
from serving.startup import parse
from testkit.containers import container, docker, logs, network, port
from testkit.processes import ROOT, Server, bentoml_serve, log_path

TEXT = "How do I reset my password?"
IDS = [[101, 2129, 2079, 1045, 25141, 2026, 20786, 1029, 102]]  # TEXT by MiniLM's tokenizer
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


def until_200(launched: float, send: Callable[[], httpx.Response], server: Server | str) -> Any:
    """Send until the answer is a 200: its JSON (None for /readyz's text), and the seconds from
    ``launched`` (``time.monotonic``). Raises, with the log's end, if ``server`` (this process's,
    or a container's ID) exits first or takes longer than LIMIT_S. The time is when the 200 came,
    not when it was asked for: a probe sent while the worker starts may wait in the socket's
    backlog until it serves."""
    checked = 0.0
    while (waited := time.monotonic() - launched) < LIMIT_S:
        if isinstance(server, Server):
            server.descendants()  # remembered now: a server that dies while starting orphans them
            if server.proc is not None and server.proc.poll() is not None:
                raise RuntimeError(f"the server exited while starting:\n{server.tail()}")
        elif waited - checked > 2:  # a container: not on every poll, an inspect costs more
            checked = waited
            if docker("inspect", "--format", "{{.State.Running}}", server) != "true":
                raise RuntimeError(f"{server[:12]} exited while starting:\n{logs(server)[-3000:]}")
        try:
            resp = send()
            if resp.status_code == 200:
                body = resp.json() if "json" in resp.headers.get("content-type", "") else None
                return body, time.monotonic() - launched
        except httpx.TransportError:
            pass
        time.sleep(POLL_S)
    tail = server.tail() if isinstance(server, Server) else logs(server)[-3000:]
    raise TimeoutError(f"no answer after {LIMIT_S} s:\n{tail}")


def same(a: Any, b: Any) -> bool:
    """Two answers alike, timings aside: numbers within MAX_ABS_DIFF."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = {k for k in a.keys() | b.keys() if not k.endswith("_ms")}
        return all(same(a.get(k), b.get(k)) for k in keys)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b))
    if numbers and (isinstance(a, float) or isinstance(b, float)):
        return bool(abs(a - b) <= MAX_ABS_DIFF)
    return bool(type(a) is type(b) and a == b)


def answers(
    client: httpx.Client, route: str, body: Any, launched: float, steady: int, p90: bool = False
) -> dict[str, float]:
    """The first answer and ``steady`` more, the first checked against the last (``same``): the
    seconds from ``launched`` to the first, its latency against the steady p50 (and p90)."""

    def timed() -> tuple[Any, float]:
        sent = time.perf_counter()
        answer = client.post(route, json=body, timeout=30).raise_for_status().json()
        return answer, time.perf_counter() - sent

    first, first_s = timed()
    answered_s = time.monotonic() - launched
    warm = [timed() for _ in range(steady)]
    if not same(first, warm[-1][0]):
        raise AssertionError(f"{route}'s first answer differs from its warm one")
    latencies = [latency for _, latency in warm]
    p50 = statistics.median(latencies)
    out = {"first_answer_s": round(answered_s, 3), "first_ms": round(first_s * 1000, 1),
           "steady_p50_ms": round(p50 * 1000, 1)}  # fmt: skip
    if p90:
        out["steady_p90_ms"] = round(statistics.quantiles(latencies, n=10)[-1] * 1000, 1)
    return {**out, "first_over_steady": round(first_s / p50, 2)}


def logged(server: Server, launched_at: float) -> dict[str, dict[str, float]]:
    """Each service's start as it logged it, its start and ready as seconds after the launch."""
    return {r["service"]: {"started_s": round(r["started_at"] - launched_at, 3),
                           **{k: r[k] for k in ("import_s", "load_s", "warm_up_s", "total_s")},
                           "ready_s": round(r["ready_at"] - launched_at, 3)}
            for r in parse(server.log.read_text(errors="replace"))}  # fmt: skip


def one_start(index: int, steady: int, idle: float) -> dict[str, Any]:
    """Start the graph, time it to ready and its first correct answer, watch it at rest, stop it."""
    server = bentoml_serve(".", log_path(f"cold-start-{index}.log"))
    launched_at, launched = time.time(), time.monotonic()
    server.launch()
    try:
        with httpx.Client(base_url=server.url) as client:
            ready_s = until_200(launched, lambda: client.get("/readyz", timeout=2), server)[1]
            figures = answers(client, "/embed", {"texts": [TEXT]}, launched, steady, p90=True)
        services = logged(server, launched_at)
        time.sleep(REST_S)
        rest = at_rest(server, sorted(services), idle)
    finally:
        server.stop()
    return {"ready_s": round(ready_s, 3), **figures, "services": services, "at_rest": rest}


# image -> (the service its log names, the route of its first answer and its body, its settings as
# deploy/compose/docker-compose.yml gives them, not its resource limits). A tenant runner with an
# empty store has no tenant to classify: its first answer is its listing. The tokenizer's settings
# are its runners' URLs, by the names ``runners`` gives them.
MINILM = {"BUNDLE_ONNX_WORKERS": "1", "BUNDLE_ONNX_MODELS": "all-MiniLM-L6-v2"}
RUNNER_URLS = {
    f"BUNDLE_TOKENIZER_{k}_URL": f"http://{k.lower()}-runner:3000" for k in ("ONNX", "TF", "TENANT")
}
IMAGES: dict[str, tuple[str, str, dict[str, Any], dict[str, str]]] = {
    "onnx-runner": ("onnx_runner", "/embed", {"ids": IDS}, MINILM),
    "tf-runner": ("tf_runner", "/embed", {"ids": IDS}, {}),
    "tenant-runner": ("tenant_runner", "/tenants/list", {}, {}),
    "tokenizer": ("tokenizer", "/embed", {"texts": [TEXT]}, RUNNER_URLS),
}


def image_start(image: str, net: str, tag: str, steady: int) -> dict[str, Any]:
    """One container of ``image`` from its launch to ready and its first correct answer."""
    service, route, body, env = IMAGES[image]
    name = f"{image}--{uuid.uuid4().hex[:6]}"
    with container(image, name, net, env, tag) as (cid, launched_at, launched):
        with httpx.Client(base_url=f"http://127.0.0.1:{port(cid)}") as client:
            # The timeout outlasts a tokenizer's own wait for its warm-up (WARM_UP_TIMEOUT_S).
            ready_s = until_200(launched, lambda: client.get("/readyz", timeout=5), cid)[1]
            figures = answers(client, route, body, launched, steady)
        started = docker("inspect", "--format", "{{.State.StartedAt}}", cid)
        container_s = dt.datetime.fromisoformat(started).timestamp() - launched_at
        # Each worker logs its start; the container is ready with the last of them.
        log = logs(cid)
        records = [r for r in parse(log) if r["service"] == service]
    if not records:
        raise RuntimeError(f"{image} logged no start of {service}:\n{log[-3000:]}")
    last = max(records, key=lambda r: r["ready_at"])
    return {"container_started_s": round(container_s, 3),
            "worker_started_s": round(last["started_at"] - launched_at, 3),
            **{k: last[k] for k in ("import_s", "load_s", "warm_up_s")},
            "ready_s": round(ready_s, 3), **figures}  # fmt: skip


def measure(
    images: list[str], starts: int, tag: str | None = None, steady: int = 30
) -> dict[str, dict[str, Any]]:
    """``starts`` starts of each of ``images`` (tagged ``tag``, default ``IMAGE_TAG`` or latest)
    and their medians (``repeated``), on a network of their own; the tokenizer's last, with the
    three runners up beside it (``runners``)."""
    if steady < 1:
        raise ValueError("steady: at least one answer after the first, to compare it with")
    tag = tag or os.environ.get("IMAGE_TAG", "latest")
    found: dict[str, dict[str, Any]] = {}
    with network("bundle-cold") as net:
        for image in sorted(images, key=lambda i: i == "tokenizer"):
            one = lambda _, image=image: image_start(image, net, tag, steady)  # noqa: E731
            with runners(net, tag) if image == "tokenizer" else contextlib.nullcontext():
                found[image] = repeated(image, starts, one)
    return found


@contextlib.contextmanager
def runners(net: str, tag: str) -> Iterator[None]:
    """The three runners' containers on ``net`` under the names the tokenizer is given, ready,
    called directly (no proxy): it reads their schemas as it starts. Every model of the catalogue
    on the ONNX one (its warm-up asks each)."""
    suffix = f"--{uuid.uuid4().hex[:6]}"  # names are the engine's; the alias is the network's
    with contextlib.ExitStack() as stack:
        started = []
        for image in ("onnx-runner", "tf-runner", "tenant-runner"):
            env = {"BUNDLE_ONNX_WORKERS": "1"} if image == "onnx-runner" else {}
            started.append(stack.enter_context(container(image, image + suffix, net, env, tag)))
        for cid, _, launched in started:
            with httpx.Client(base_url=f"http://127.0.0.1:{port(cid)}") as client:
                until_200(launched, functools.partial(client.get, "/readyz", timeout=5), cid)
        yield


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
    rest = ["CPU (share of a core)", "wake-ups per second", "resident MB"]
    lines += table("at rest", rest, m["at_rest"])
    if images := {name: found["median"] for name, found in result.get("images", {}).items()}:
        heads = ["container started", "worker started", "import", "model load", "warm-up",
                 "ready", "first correct answer", "first ms", "steady p50 ms", "first / p50"]  # fmt: skip
        lines += table("image (from its launch, s)", heads, images)
    return "\n".join(lines)


def meta(measured: str) -> dict[str, Any]:
    """How and on what code a run was measured."""
    return {
        **record_meta(measured),
        "command": "python -m loadtests.cold_start " + " ".join(sys.argv[1:]),
    }


def run(starts: int, steady: int, idle: float) -> dict[str, Any]:
    measured = commit()  # the code the servers start with, not what the tree holds at the end
    graph = repeated("start", starts, lambda index: one_start(index, steady, idle))
    return {"meta": meta(measured), **graph}


def with_images(result: dict[str, Any], starts: int, steady: int) -> dict[str, Any]:
    """``result`` (a record of the graph) with each image's starts and their medians added, and
    how and on what code they were measured."""
    measured = commit()
    images = measure(list(IMAGES), starts, steady=steady)
    return {**result, "meta": {**result["meta"], "images": meta(measured)}, "images": images}


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
    parser.add_argument("--images", action="store_true", help="each image's container instead")
    args = parser.parse_args(argv)
    if args.images:
        path = graph_record(commit())
        result = with_images(json.loads(path.read_text()), args.starts, args.steady)
    else:
        result = run(args.starts, args.steady, args.idle)
        path = RESULTS / f"{result['meta']['date'][:10]}.json"
    print(render(result))
    if args.record:
        write(path, result, indent=1)
        LAST.parent.mkdir(parents=True, exist_ok=True)
        LAST.write_text(f"{path}\n")
        print(f"recorded in {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
