"""The side-by-side benchmark (``make bench``; ``BENCH_QUICK=1``: every system once, in minutes).

The systems, how points are interleaved and drained, what is recorded: loadtests/README.md; when
a run records nothing and exits 1 (a served figure above its raw limit): ``publish``.
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
from typing import Any

from loadtests import cpu, isolation, report, tasks
from loadtests.points import (
    BULK_LONGER,
    FASTAPI,
    HANDWRITTEN,
    INT8,
    MIDDLE,
    NAIVE,
    NOBATCH,
    OUT,
    QUICK,
    STACK,
    SYSTEMS,
    USERS,
    WORKLOADS,
    Point,
    drain,
    point,
)
from loadtests.raw_engine import at_edge, best_of, raw_engine
from testkit.processes import ROOT, Server, Servers, adopt_orphans, bentoml_serve, uvicorn

RESULTS = report.RESULTS
# A server that has not worked off its last point's queue in this long is restarted instead; in a
# quick run sooner (naive BentoML does not drain after a bulk point: it is restarted either way).
QUICK_SETTLE_S = 15
SETTLE_S = QUICK_SETTLE_S if QUICK else 60


def servers() -> dict[str, Server]:
    """One server per system; the int8 points go to the stack's own server."""
    logs = OUT / "logs"
    return {
        STACK: bentoml_serve(".", logs / "stack.log"),
        NOBATCH: bentoml_serve(".", logs / "nobatch.log", env={"BUNDLE_ONNX_MAX_BATCH_ROWS": "1"}),
        FASTAPI: uvicorn("loadtests.baselines.fastapi_server:app", logs / "fastapi.log"),
        NAIVE: bentoml_serve("loadtests.baselines.naive_bentoml:NaiveFront", logs / "naive.log"),
        HANDWRITTEN: uvicorn("loadtests.baselines.batching_server:app", logs / "handwritten.log"),
    }


def cases() -> Iterator[tuple[str, int, str]]:
    """(workload, users, system) of one repeat, in order. A quick run measures every system once
    at its heavier load, and the stack and FastAPI at one client too (a target compares them)."""
    one_client = {("chat", STACK), ("chat", FASTAPI)}
    for workload in WORKLOADS:
        for users in USERS:
            for system in SYSTEMS:
                if not (QUICK and users == min(USERS) and (workload, system) not in one_client):
                    yield workload, users, system


def settle(running: dict[str, Server], timeout_s: float = SETTLE_S) -> list[str]:
    """Before each point, every server drained, not only the one measured (loadtests/README.md).
    One that has not within ``timeout_s`` is restarted by PID on the same port, and its name
    returned for the point to record; one that has exited stops the run with its log."""
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


def measure_raw(when: str) -> dict[str, dict]:
    """The raw limit of the stack's default model (the catalogue's first embed model) on each ONNX
    backend, printed as measured; a quick run times one plan of each kind on ~300 of the texts."""
    from serving import catalogue

    served = catalogue.current().default("embed")
    if served is None:
        raise SystemExit(f"error: {catalogue.path()} has no embed model to measure")
    texts = 300 if QUICK else None
    raw = {key: raw_engine(served.name, backend, 1 if QUICK else 3, texts, quick=QUICK)
           for key, backend in (("fp32", "onnx"), ("int8", "onnx-int8"))}  # fmt: skip
    measured = ", ".join(f"{served.name} {b} {limit['sentences_per_s']:.0f} sentences/s "
                         f"({limit['plan']})" for b, limit in raw.items())  # fmt: skip
    print(f"raw engine ({when} of the run): {measured}", flush=True)
    for backend, limit in raw.items():
        if at_edge(limit["plan"]) and not QUICK:
            print(
                f"warning: {backend}'s best plan ({limit['plan']}) is at the edge of the sweep: a plan "
                "beyond it may be faster (raw_engine.ROW_COUNTS, TOKEN_BUDGETS)",
                flush=True,
            )
    return raw


@contextlib.contextmanager
def kept_on_failure(path: Path, raw: dict, points: list[Point]) -> Iterator[None]:
    """If the run stops with an error, the points measured so far are written to ``path`` (an hour
    of measurements is not lost with it), then the error goes on."""
    try:
        yield
    except BaseException:
        write(path, {"raw": raw, "points": [asdict(p) for p in points]})
        print(f"the points measured before the error are in {path}", file=sys.stderr, flush=True)
        raise


def commit() -> str:
    proc = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True
    )
    return proc.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def record_meta(measured: str) -> dict[str, Any]:
    """What every record says of its run: when, the code measured (``commit()``), the machine."""
    return {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "commit": measured,
            "machine": cpu.machine(), "cores": os.cpu_count() or 1,
            "python": sys.version.split()[0]}  # fmt: skip


def write(path: Path, data: dict, indent: int = 2) -> Path:
    """``data`` as JSON at ``path``, its folder made first; ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    measured = commit()  # the code the servers start with, not what the tree holds at the end
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds", type=float, default=float(os.environ.get("BENCH_SECONDS", 3 if QUICK else 10))
    )
    parser.add_argument(
        "--repeats", type=int, default=int(os.environ.get("BENCH_REPEATS", 1 if QUICK else 3))
    )
    parser.add_argument(
        "--no-record", dest="record", action="store_false", default=not QUICK, help="record nothing"
    )
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    print(
        f"benchmark: {'quick, ' if QUICK else ''}{args.seconds:.0f} s a point, users {USERS}, "
        f"{args.repeats} repeats",
        flush=True,
    )
    raw = measure_raw("start")
    points: list[Point] = []
    adopt_orphans()  # a BentoML worker whose arbiter died stays this process's, stopped by PID
    # Outermost: whatever stops the run, the servers' stop or the last raw sweep included, leaves
    # the points measured so far.
    with kept_on_failure(OUT / "partial.json", raw, points):
        with Servers(servers()) as running:
            for repeat in range(args.repeats):
                for workload, users, system in cases():
                    restarted = settle(running)
                    backend = "onnx-int8" if system == INT8 else ""
                    seconds = args.seconds * (BULK_LONGER if workload == "bulk" else 1)
                    server = running[STACK if system == INT8 else system]
                    p = point(server, system, workload, users, seconds, repeat, backend, restarted)
                    points.append(p)
                    print(
                        f"  [{repeat + 1}/{args.repeats}] {system:<22} {workload:<5} {users:>3} users: "
                        f"{p.sentences_per_s:7.1f} sentences/s, p50 {p.p50_ms:.1f} ms, p99 {p.p99_ms:.0f} ms, "
                        f"{p.failures} failed, {p.shed} shed, load-gen CPU {p.loadgen_cpu_share:.1%}",
                        flush=True,
                    )
            settle(running)
            # A head's request carries a bulk request's inputs: a chat point's length could end
            # with the users' first requests all in flight, counting none.
            heads = tasks.measure(running[STACK], OUT, MIDDLE, args.seconds * BULK_LONGER, QUICK)
        # Again at the end, the servers stopped, each plan's best of both kept: a slower minute
        # only lowers a measurement, and a quick run's single timings the most easily.
        end = measure_raw("end")
        raw = {backend: best_of(raw[backend], end[backend]) for backend in raw}
        several = isolation.measure(OUT, args.seconds * (1 if QUICK else 2))
        print(report.several_models(several), flush=True)
    meta = {
        **record_meta(measured), "quick": QUICK, "seconds_per_point": args.seconds,
        "repeats": args.repeats, "users": list(USERS), "middle": MIDDLE, "settle_s": SETTLE_S,
        "load_generator": "wrk (loadtests/wrk/bodies.lua)",
    }  # fmt: skip
    results = report.results(points, raw, meta)
    results["several_models"] = several
    results["tasks"] = heads
    return publish(results, record=args.record)


def publish(results: dict, *, record: bool) -> int:
    """Write a run to build/bench, print its table and targets and, where ``record``, record it
    (loadtests/results): not when a served figure is above its raw limit (then 1, else 0; a quick
    run, never recorded, allows ``report.QUICK_SLACK`` and warns within it)."""
    written = [write(OUT / "results.json", results), OUT / "results.md"]
    table = report.markdown(results)
    (OUT / "results.md").write_text(table + "\n")
    print("\n" + table + "\n")
    for check in results["targets"]:
        print(f"{'met   ' if check['met'] else 'MISSED'} {check['target']}: {check['measured']}")
    wrong = report.above_raw(results)
    if record and not wrong:  # a run with a wrong limit is not one to publish
        recorded = write(RESULTS / f"{results['meta']['date'][:10]}.json", results)
        written += [recorded, report.write_results_md(recorded)]
    print("\nwritten: " + ", ".join(str(p) for p in written))
    if within := [figure for figure in report.above_raw(results, slack=0.0) if figure not in wrong]:
        print(
            f"warning: served above its raw limit, within a quick run's {report.QUICK_SLACK:.0%}: "
            f"{within}",
            file=sys.stderr,
        )
    if wrong:
        print(
            f"error: served above its raw limit (the limit is wrong; nothing recorded): {wrong}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
