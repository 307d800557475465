"""The side-by-side benchmark (``make bench``; ``BENCH_QUICK=1`` for a few seconds a point).

In one run, on one machine, with the same load generator (wrk, loadgen.py) and corpus for every
system:
- raw: the engine in this process, no HTTP, per backend (fp32, int8): the best of row-count and
  token-budget plans (raw_engine.py): the limit;
- stack: this project (``bentoml serve .``), fp32, and the same server with backend onnx-int8;
- stack, batching off: the same graph with one sequence per engine call;
- fastapi: a FastAPI + ONNX Runtime server answering one request at a time;
- naive bentoml: ``batchable=True`` on ``list[list[int]]``, padded to the longest;
- hand-written batching: one Starlette process with a length-sorting dynamic batcher.
Then the stack on bulk at 64 users with vectors as JSON floats and as base64 ("encoding"): what
base64 saves in CPU per request and bytes on the wire. Then /classify at 64 users, one text per
request for a tenant drawn Zipf-style from 1,000 demo tenants: head tenants (the stack's own tenant
store, ``make tenants``) against a whole model per tenant (a second graph on the store of ``make
tenants-mixed``, under the tenant runner's memory budget).
Every server runs for the whole benchmark and the points are interleaved: for each repeat, each
workload and user count, every system in turn, so a noisy minute is shared by all; before each
point every server is drained, and one that has not worked off its queue in SETTLE_S is restarted
(the results count the restarts by server). Each point
records, per server process, the CPU it spent per request (cpu.py). Medians and spreads over the
repeats make the table. Writes build/bench/results.json, results.md and a PNG per workload; a full
run (not quick) also records loadtests/results/DATE.json and regenerates the figures of
loadtests/README.md from it (``--no-record`` skips that).
Exits 1 if a served figure is above its backend's raw limit (the limit would be wrong), and records
nothing then. If the run stops with an error, the points measured so far are in
build/bench/partial.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from loadtests import cpu, report
from loadtests.points import (
    BENTOML_PATH,
    BULK_LONGER,
    CLASSIFY,
    ENCODINGS,
    FASTAPI,
    HANDWRITTEN,
    HEADS,
    INT8,
    MIDDLE,
    MODELS,
    NAIVE,
    NOBATCH,
    OUT,
    PATH_SYSTEMS,
    QUICK,
    STACK,
    SYSTEMS,
    TENANT_SYSTEMS,
    TENANTS,
    TRACED,
    TRACED_PATH,
    TRACING,
    USERS,
    WORKLOADS,
    Point,
    bodies,
    drain,
    point,
    response_bytes,
)
from loadtests.processes import ROOT, Server, adopt_orphans, bentoml_serve, uvicorn
from loadtests.raw_engine import at_edge, best_of, raw_engine

RESULTS = ROOT / "loadtests" / "results"


def servers(head_store: Path, model_store: Path) -> dict[str, Server]:
    """One server per system; the int8 and head-tenant points go to the stack's own server."""
    logs = OUT / "logs"
    return {
        STACK: bentoml_serve(
            ".", logs / "stack.log", env={"BUNDLE_TENANTS_STORE": str(head_store)}
        ),
        MODELS: bentoml_serve(
            ".", logs / "models.log", env={"BUNDLE_TENANTS_STORE": str(model_store)}
        ),
        NOBATCH: bentoml_serve(".", logs / "nobatch.log", env={"BUNDLE_ONNX_MAX_BATCH_ROWS": "1"}),
        TRACED_PATH: bentoml_serve(".", logs / "traced.log", env=TRACING),
        BENTOML_PATH: bentoml_serve(".", logs / "bentoml-path.log", env=TRACED),
        FASTAPI: uvicorn("loadtests.baselines.fastapi_server:app", logs / "fastapi.log"),
        NAIVE: bentoml_serve("loadtests.baselines.naive_bentoml:NaiveFront", logs / "naive.log"),
        HANDWRITTEN: uvicorn("loadtests.baselines.batching_server:app", logs / "handwritten.log"),
    }


# A server that has not worked off its last point's queue in this long is restarted instead.
SETTLE_S = 60


def settle(running: dict[str, Server], timeout_s: float = SETTLE_S) -> list[str]:
    """Before each point, every server drained, not only the one measured: a server still working
    off the backlog of its last point would take the cores from this one. One that has not within
    ``timeout_s`` is restarted (stopped by PID with its descendants, started on the same port), and
    its name returned for the point to record. A restart is faster than waiting out a one-at-a-time
    server's backlog, and it resets BentoML's adaptive-batching dispatcher (the naive baseline's),
    which holds its queue while n x (the newest request's wait + its per-item estimate) is below
    0.95 x the mean wait of its last 50 batches: after an overload, a lone request waits about as
    long as the overloaded batches did (seconds to tens of seconds, in the naive baseline's log of a
    full run, for the half hour until that run was stopped). A server that has exited is not
    restarted: the run stops with its log."""
    restarted = []
    for name, server in running.items():
        exited(name, server)
        if drain(server.url, timeout_s):
            continue
        exited(name, server)
        print(f"  {name} had not worked off its queue in {timeout_s:.0f} s: restarted", flush=True)
        server.restart()
        restarted.append(name)
        if not drain(server.url, timeout_s):
            raise RuntimeError(f"{name} still slow after a restart:\n{server.tail()}")
    return restarted


def exited(name: str, server: Server) -> None:
    """Raise, with the end of its log, if ``server`` is no longer running: that is a crash to read,
    not a backlog to restart past."""
    if server.proc is not None and server.proc.poll() is not None:
        raise RuntimeError(f"{name} exited with {server.proc.returncode}:\n{server.tail()}")


def measure_raw(repeats: int, texts: int | None, when: str) -> dict[str, dict]:
    """The raw limit per backend (fp32, int8), printed as measured."""
    from serving import contracts

    raw = {
        "fp32": raw_engine(contracts.ONNX_FP32, repeats, texts),
        "int8": raw_engine(contracts.ONNX_INT8, repeats, texts),
    }
    print(
        f"raw engine ({when} of the run): {raw['fp32']['sentences_per_s']:.0f} sentences/s fp32 ({raw['fp32']['plan']}), {raw['int8']['sentences_per_s']:.0f} int8 ({raw['int8']['plan']})",
        flush=True,
    )
    for backend, limit in raw.items():
        if at_edge(limit["plan"]):
            print(
                f"warning: {backend}'s best plan ({limit['plan']}) is at the edge of the sweep: a plan "
                "beyond it may be faster (raw_engine.ROW_COUNTS, TOKEN_BUDGETS)",
                flush=True,
            )
    return raw


@contextlib.contextmanager
def kept_on_failure(path: Path, raw: dict, **measured: list[Point]) -> Iterator[None]:
    """If the run stops with an error, the points measured so far are written to ``path`` (an hour
    of measurements is not lost with it), then the error goes on."""
    try:
        yield
    except BaseException:
        path.write_text(
            json.dumps(
                {"raw": raw, **{k: [asdict(p) for p in v] for k, v in measured.items()}}, indent=2
            )
            + "\n"
        )
        print(f"the points measured before the error are in {path}", file=sys.stderr, flush=True)
        raise


def missing_tenants(store: Path, heads: bool) -> int:
    """Demo tenants 1..TENANTS absent from ``store``, or there in the other form."""
    from models import demo_tenants
    from runners.tenants.store import TenantStore, read_manifest

    tenants = TenantStore(store)
    missing = 0
    for index in range(1, TENANTS + 1):
        found = tenants.current(demo_tenants.tenant(index).name)
        if found is None or (read_manifest(found[1]).format == "head") != heads:
            missing += 1
    return missing


def commit() -> str:
    proc = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True
    )
    return proc.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    measured = commit()  # the code the servers start with, not what the tree holds at the end
    started = dt.datetime.now(dt.UTC)
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--seconds", type=float, default=float(os.environ.get("BENCH_SECONDS", 3 if QUICK else 10))
    )
    parser.add_argument(
        "--repeats", type=int, default=int(os.environ.get("BENCH_REPEATS", 1 if QUICK else 3))
    )
    parser.add_argument(
        "--head-store",
        type=Path,
        default=os.environ.get("BENCH_HEAD_STORE"),
        help="tenant store of the head tenants (default: the tenant runner's, make tenants)",
    )
    parser.add_argument(
        "--model-store",
        type=Path,
        default=os.environ.get("BENCH_MODEL_STORE") or Path.home() / "bentoml" / "tenants-mixed",
        help="tenant store of the whole-model tenants (make tenants-mixed)",
    )
    parser.add_argument(
        "--no-record",
        dest="record",
        action="store_false",
        default=not QUICK,
        help="do not write loadtests/results/DATE.json nor regenerate loadtests/README.md's figures",
    )
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    from runners.tenants.settings import TenantRunnerSettings

    head_store = args.head_store or TenantRunnerSettings().store
    for store, heads, target in (
        (head_store, True, "tenants"),
        (args.model_store, False, "tenants-mixed"),
    ):
        if missing := missing_tenants(store, heads):
            print(
                f"error: {missing} of {TENANTS} demo tenants missing from {store}: run `make {target} N={TENANTS}`",
                file=sys.stderr,
            )
            return 2

    print(
        f"benchmark: {'quick, ' if QUICK else ''}{args.seconds:.0f} s a point, users {USERS}, {args.repeats} repeats",
        flush=True,
    )
    # A quick run times every plan on ~500 texts with the corpus's lengths (raw_engine.sample).
    repeats, texts = (1, 500) if QUICK else (3, None)
    raw = measure_raw(repeats, texts, "start")
    points: list[Point] = []
    wire: list[Point] = []
    classified: list[Point] = []
    lean: list[Point] = []
    adopt_orphans()  # a BentoML worker whose arbiter died stays this process's, stopped by PID
    running = servers(head_store, args.model_store)
    # Outermost: whatever stops the run, the servers' stop or the last raw sweep included, leaves
    # the points measured so far.
    with kept_on_failure(
        OUT / "partial.json", raw, points=points, wire=wire, tenants=classified, paths=lean
    ):
        with contextlib.ExitStack() as stack:
            for server in running.values():
                stack.enter_context(server)
            for repeat in range(args.repeats):
                for workload in WORKLOADS:
                    for users in USERS:
                        for system in SYSTEMS:
                            server = running[STACK if system == INT8 else system]
                            restarted = settle(running)
                            backend = "onnx-int8" if system == INT8 else ""
                            seconds = args.seconds * (BULK_LONGER if workload == "bulk" else 1)
                            p = point(
                                server,
                                system,
                                workload,
                                users,
                                seconds,
                                repeat,
                                backend,
                                restarted=restarted,
                            )
                            points.append(p)
                            print(
                                f"  [{repeat + 1}/{args.repeats}] {system:<22} {workload:<5} {users:>3} users: "
                                f"{p.sentences_per_s:7.1f} sentences/s, p50 {p.p50_ms:.1f} ms, p99 {p.p99_ms:.0f} ms, "
                                f"{p.failures} failed, {p.shed} shed, load-gen CPU {p.loadgen_cpu_share:.1%}",
                                flush=True,
                            )
            # base64 against JSON floats, on the stack's bulk answers (interleaved repeats too).
            for repeat in range(args.repeats):
                for encoding in ENCODINGS:
                    restarted = settle(running)
                    seconds = args.seconds * BULK_LONGER
                    p = point(
                        running[STACK],
                        STACK,
                        "bulk",
                        MIDDLE,
                        seconds,
                        repeat,
                        encoding=encoding,
                        restarted=restarted,
                    )
                    wire.append(p)
                    print(
                        f"  [{repeat + 1}/{args.repeats}] {STACK} bulk {MIDDLE} users, {encoding:<6}: "
                        f"{p.sentences_per_s:7.1f} sentences/s, {p.failures} failed",
                        flush=True,
                    )
            # The lean path against BentoML's own path, chat at one client and at the middle load.
            for repeat in range(args.repeats):
                for users in (min(USERS), MIDDLE):
                    for system in PATH_SYSTEMS:
                        restarted = settle(running)
                        p = point(
                            running[system],
                            system,
                            "chat",
                            users,
                            args.seconds,
                            repeat,
                            restarted=restarted,
                        )
                        lean.append(p)
                        print(
                            f"  [{repeat + 1}/{args.repeats}] {system:<24} chat {users:>3} users: "
                            f"{p.sentences_per_s:7.1f} sentences/s, p50 {p.p50_ms:.1f} ms, {p.failures} failed",
                            flush=True,
                        )
            # /classify: head tenants against a whole model per tenant (interleaved repeats too).
            for repeat in range(args.repeats):
                for system in TENANT_SYSTEMS:
                    restarted = settle(running)
                    server = running[STACK if system == HEADS else MODELS]
                    seconds = args.seconds * BULK_LONGER  # cold loads make the whole models noisy
                    p = point(
                        server, system, CLASSIFY, MIDDLE, seconds, repeat, restarted=restarted
                    )
                    classified.append(p)
                    print(
                        f"  [{repeat + 1}/{args.repeats}] {system:<24} classify {MIDDLE} users: "
                        f"{p.requests_per_s:7.1f} requests/s, p50 {p.p50_ms:.1f} ms, p99 {p.p99_ms:.0f} ms, "
                        f"{p.failures} failed, {p.shed} shed",
                        flush=True,
                    )
            wire_bytes = {
                e: response_bytes(running[STACK].url, bodies("bulk", "", e)) for e in ENCODINGS
            }
        # Again at the end, the servers stopped, and the best of both kept (raw_engine.best_of).
        end = measure_raw(repeats, texts, "end")
    raw = {backend: best_of(raw[backend], end[backend]) for backend in raw}
    results = report.results(
        points,
        raw,
        wire=(wire, wire_bytes),
        tenants=classified,
        paths=lean,
        meta={
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "started": started.isoformat(timespec="seconds"),
            "commit": measured,
            "machine": cpu.machine(),
            "cores": os.cpu_count() or 1,
            "python": sys.version.split()[0],
            "quick": QUICK,
            "seconds_per_point": args.seconds,
            "repeats": args.repeats,
            "users": list(USERS),
            "middle": MIDDLE,
            "settle_s": SETTLE_S,
            "load_generator": "wrk (loadtests/wrk/bodies.lua)",
            "tenants": TENANTS,
        },
    )
    return publish(results, record=args.record)


def publish(results: dict, *, record: bool) -> int:
    """Write a run to build/bench (JSON, table, plots), print its table and targets and, where
    ``record``, record it: loadtests/results/DATE.json and loadtests/README.md's figures. A served
    figure above its backend's raw limit means the limit is wrong: then nothing is recorded and
    the exit status is 1 (0 otherwise)."""
    (OUT / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    table = report.markdown(results)
    (OUT / "results.md").write_text(table + "\n")
    plots = report.plot(results, OUT)
    print("\n" + table + "\n")
    for check in results["targets"]:
        print(f"{'met   ' if check['met'] else 'MISSED'} {check['target']}: {check['measured']}")
    written = [OUT / "results.json", OUT / "results.md", *plots]
    wrong = report.above_raw(results)
    if record and not wrong:  # a run with a wrong limit is not one to publish
        RESULTS.mkdir(parents=True, exist_ok=True)
        recorded = RESULTS / f"{results['meta']['date'][:10]}.json"
        recorded.write_text(json.dumps(results, indent=2) + "\n")
        report.update_readme(recorded)
        written += [recorded, report.README]
    print("\nwritten: " + ", ".join(str(p) for p in written))
    if wrong:
        print(
            f"error: served above its raw limit (the limit is wrong; nothing recorded): {wrong}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
