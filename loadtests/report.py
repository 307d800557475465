"""The benchmark's report: points aggregated over repeats (median and spread), ratios to each
backend's raw limit and to the other systems, per-request CPU, the targets, the table and plots.

    python -m loadtests.report loadtests/results/DATE.json    # regenerate loadtests/README.md's figures
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path

from loadtests import readme_blocks
from loadtests.plots import plot
from loadtests.points import (
    BENTOML_PATH,
    BULK_LONGER,
    FASTAPI,
    HANDWRITTEN,
    HEADS,
    INT8,
    MODELS,
    NAIVE,
    NOBATCH,
    PATH_SYSTEMS,
    STACK,
    SYSTEMS,
    TRACED_PATH,
    WORKLOADS,
    Point,
)
from loadtests.processes import ROOT
from loadtests.targets import targets

__all__ = [
    "above_raw",
    "backend_of",
    "holds_back",
    "markdown",
    "plot",
    "readme_block",
    "readme_figures",
    "restarts",
    "results",
    "served_rows",
    "update_readme",
]

README = readme_blocks.README
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def backend_of(system: str) -> str:
    return "int8" if system == INT8 else "fp32"


def _median_cpu(rows: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each process's figures, the median over the repeats that measured it; a figure only some
    repeats have (the engine split, where a runner's counter could not be read) is left out."""
    names = {name for row in rows for name in row}
    out = {}
    for name in sorted(names):
        measured = [r[name] for r in rows if name in r]
        keys = [k for k in measured[0] if all(k in m for m in measured)]
        out[name] = {k: round(statistics.median(m[k] for m in measured), 4) for k in keys}
    return out


def aggregate(points: list[Point]) -> list[dict]:
    """One row per (system, workload, users): medians over the repeats, and the spread."""
    groups: dict[tuple[str, str, int], list[Point]] = defaultdict(list)
    for p in points:
        groups[(p.system, p.workload, p.users)].append(p)
    rows = []
    for (system, workload, users), ps in groups.items():
        rates = [p.sentences_per_s for p in ps]
        rows.append(
            {
                "system": system,
                "workload": workload,
                "users": users,
                "repeats": len(ps),
                "sentences_per_s": round(statistics.median(rates), 2),
                "spread": [round(min(rates), 2), round(max(rates), 2)],
                "p50_ms": round(statistics.median(p.p50_ms for p in ps), 2),
                "p99_ms": round(statistics.median(p.p99_ms for p in ps), 2),
                "failures": sum(p.failures for p in ps),
                "shed": sum(p.shed for p in ps),
                "loadgen_cpu_share": round(max(p.loadgen_cpu_share for p in ps), 4),
                "cpu_ms_per_request": _median_cpu([p.cpu_ms_per_request for p in ps]),
            }
        )
    return rows


def table(points: list[Point]) -> list[dict]:
    """The systems' rows (``aggregate``) in the table's order: workload, users, system."""
    return sorted(
        aggregate(points),
        key=lambda r: (
            list(WORKLOADS).index(r["workload"]),
            r["users"],
            SYSTEMS.index(r["system"]),
        ),
    )


def ratios(rows: list[dict], raw: dict) -> list[dict]:
    at = {(r["system"], r["workload"], r["users"]): r["sentences_per_s"] for r in rows}
    out = []
    for workload, users in sorted({(r["workload"], r["users"]) for r in rows}):
        stack = at.get((STACK, workload, users))
        if stack is None:
            continue
        row = {"workload": workload, "users": users, "stack_sentences_per_s": stack}
        row["served_over_raw"] = round(stack / raw["fp32"]["sentences_per_s"], 4)
        if (int8 := at.get((INT8, workload, users))) is not None:
            row["int8_served_over_raw"] = round(int8 / raw["int8"]["sentences_per_s"], 4)
            row["int8_over_fp32"] = round(int8 / stack, 4) if stack else None
        for name, system in (
            ("vs_fastapi", FASTAPI),
            ("vs_naive", NAIVE),
            ("vs_batching_off", NOBATCH),
            ("vs_handwritten", HANDWRITTEN),
        ):
            other = at.get((system, workload, users))
            row[name] = round(stack / other, 4) if other else None
        out.append(row)
    return out


def encoding(points: list[Point], response_bytes: dict[str, float]) -> dict:
    """JSON floats against base64 on the same bulk load: medians over the repeats, bytes per
    response, and base64's share of each (below 1: what it saves)."""
    by = {e: aggregate([p for p in points if p.encoding == e]) for e in response_bytes}
    rows = {e: {**r[0], "response_bytes": round(response_bytes[e])} for e, r in by.items() if r}
    if set(rows) != {"float", "base64"}:
        return {"rows": rows}

    def cpu(row: dict) -> float:
        return sum(v["total_ms"] for v in row["cpu_ms_per_request"].values())

    f, b = rows["float"], rows["base64"]
    return {
        "rows": rows,
        "base64_over_float": {
            "response_bytes": round(b["response_bytes"] / f["response_bytes"], 4),
            "cpu_ms_per_request": round(cpu(b) / cpu(f), 4),
            "sentences_per_s": round(b["sentences_per_s"] / f["sentences_per_s"], 4),
        },
    }


def tenant_forms(points: list[Point]) -> dict:
    """/classify: head tenants against a whole model per tenant, medians over the repeats, and the
    heads' share of each figure (above 1 for throughput: heads serve more)."""
    rows = {r["system"]: r for r in aggregate(points)}
    if set(rows) != {HEADS, MODELS}:
        return {"rows": rows}
    heads, models = rows[HEADS], rows[MODELS]

    def cpu(row: dict) -> float:
        return sum(v["total_ms"] for v in row["cpu_ms_per_request"].values())

    return {
        "rows": rows,
        "heads_over_models": {
            "requests_per_s": round(heads["sentences_per_s"] / models["sentences_per_s"], 4),
            "p99_ms": round(heads["p99_ms"] / models["p99_ms"], 4),
            "cpu_ms_per_request": round(cpu(heads) / cpu(models), 4),
        },
    }


def lean_path(points: list[Point]) -> dict:
    """The stack against the same graph on BentoML's own path: hot routes traced with the access
    log off (``lean_over_traced``: what the tracing setting alone costs) and on
    (``lean_over_bentoml``). Medians by users, and the lean path's share of each figure."""
    rows = aggregate(points)
    by = {(r["system"], r["users"]): r for r in rows}

    def shares(other: str) -> dict:
        out = {}
        for users in sorted({r["users"] for r in rows}):
            lean, full = by.get((STACK, users)), by.get((other, users))
            if lean and full:
                tokenizer = [
                    r["cpu_ms_per_request"].get("tokenizer", {}).get("total_ms")
                    for r in (lean, full)
                ]
                out[str(users)] = {
                    "sentences_per_s": round(lean["sentences_per_s"] / full["sentences_per_s"], 4),
                    "p50_ms": round(lean["p50_ms"] / full["p50_ms"], 4),
                    "tokenizer_cpu_ms": tokenizer,
                }
        return out

    return {
        "rows": rows,
        "lean_over_traced": shares(TRACED_PATH),
        "lean_over_bentoml": shares(BENTOML_PATH),
    }


def results(
    points: list[Point],
    raw: dict,
    meta: dict,
    wire: tuple[list[Point], dict[str, float]] | None = None,
    tenants: list[Point] | None = None,
    paths: list[Point] | None = None,
) -> dict:
    """``wire``: the stack's bulk points by vector encoding, and the mean response size of each;
    ``tenants``: the /classify points of both tenant forms; ``paths``: chat points of the stack
    and of the same graph on BentoML's own path."""
    rows = table(points)
    ratio_rows = ratios(rows, raw)
    extra = {"encoding": encoding(*wire)} if wire else {}
    if tenants:
        extra["tenants"] = tenant_forms(tenants)
    if paths:
        extra["paths"] = lean_path(paths)
    run = {
        "meta": meta,
        "raw": raw,
        "rows": rows,
        "ratios": ratio_rows,
        "points": [asdict(p) for p in points],
        # Servers restarted before a point, having not worked off the last one's queue (bench.settle).
        "restarts": restarts(
            [*points, *(wire[0] if wire else []), *(tenants or []), *(paths or [])]
        ),
        **extra,
    }
    return {**run, "targets": checked(run)}


def restarts(points: list[Point]) -> dict[str, int]:
    """How many points each server was restarted before (loadtests.bench.settle), by name."""
    return dict(sorted(Counter(name for p in points for name in p.restarted).items()))


def every_row(results: dict) -> list[dict]:
    """Every aggregated row of a run: the systems', the lean-against-BentoML path's, the
    encodings' and /classify's."""
    rows = [*results["rows"], *results.get("paths", {}).get("rows", [])]
    rows += results.get("encoding", {}).get("rows", {}).values()
    rows += results.get("tenants", {}).get("rows", {}).values()
    return rows


def checked(results: dict) -> list[dict]:
    """The targets, checked again from the run's rows (a recorded run renders with today's)."""
    meta = results["meta"]
    return targets(
        results["rows"],
        results["ratios"],
        sorted(meta["users"]),
        meta["middle"],
        every_row(results),
    )


def served_rows(results: dict) -> list[dict]:
    """Every aggregated /embed row: the systems', the lean-against-BentoML path's and the
    encodings' (/classify is not sentences of the engine's: no raw limit)."""
    rows = list(results["rows"])
    rows += results.get("paths", {}).get("rows", [])
    rows += [{**r, "system": STACK} for r in results.get("encoding", {}).get("rows", {}).values()]
    return rows


def above_raw(results: dict) -> list[str]:
    """Served figures above their backend's raw limit: the limit would be wrong."""
    return [
        f"{r['system']} {r['workload']} {r['users']}: {r['sentences_per_s']:.0f} > {results['raw'][backend_of(r['system'])]['sentences_per_s']:.0f}"
        for r in served_rows(results)
        if r["sentences_per_s"] > results["raw"][backend_of(r["system"])]["sentences_per_s"]
    ]


def _cpu_cell(row: dict) -> str:
    cpu = row["cpu_ms_per_request"]
    parts = [
        f"{name} {v['main_ms']:.2f}+{v['other_threads_ms']:.2f}"
        for name, v in cpu.items()
        if v["total_ms"] >= 0.005
    ]
    return "; ".join(parts)


def _engine_and_serving(cpu: dict[str, dict[str, float]]) -> tuple[float, float]:
    """CPU ms per request on the engine and on everything else. The engine: inside the engine
    calls where the process counts them (the stack's runners, ``engine_ms``), otherwise the other
    threads of the process that runs it (a one-process server's worker threads, which pad and
    batch too). Everything else: every process's main thread (HTTP, JSON, tokenizing, batching,
    the hops) and a runner's lanes around its engine calls."""
    engine = sum(
        v.get("engine_ms", v["other_threads_ms"])
        for name, v in cpu.items()
        if name not in ("tokenizer", "NaiveFront")
    )
    total = sum(v["total_ms"] for v in cpu.values())
    return engine, total - engine


def where_time_goes(results: dict) -> list[str]:
    """Per sentence at the middle load, the CPU each system spends on the engine and around it,
    against the raw engine's (all of the machine's cores for the raw rate): what bounds each
    ratio the targets name."""
    cores = results["meta"]["cores"]
    users = results["meta"]["middle"]
    lines = [
        "",
        f"Where the CPU goes, per sentence at {users} users (ms; engine: inside the engine calls "
        f"where the runner counts them (the stack's), else the engine's threads; around it: "
        f"everything else — every process's main thread (HTTP, JSON, tokenizing, batching, the "
        f"hops) and a runner's lanes around its engine calls; "
        f"{cores} cores, so {cores * 1000} ms of CPU a second; raw: the cores' time per sentence, "
        f"tokenizing and the engine in one process):",
        "",
        "| workload | system | sentences/s | engine ms | around it ms | total ms | cores busy |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for workload, per in WORKLOADS.items():
        for backend in ("fp32", "int8"):
            rate = results["raw"][backend]["sentences_per_s"]
            # Raw's time is wall time on every core, tokenizing included: not split, not measured
            # from /proc like the servers'.
            lines.append(
                f"| {workload} | raw {backend} | {rate:.0f} | — | — | "
                f"{cores * 1000 / rate:.2f} | {cores} (all) |"
            )
        for r in results["rows"]:
            if r["workload"] != workload or r["users"] != users:
                continue
            engine, around = (ms / per for ms in _engine_and_serving(r["cpu_ms_per_request"]))
            busy = (engine + around) * r["sentences_per_s"] / 1000
            lines.append(
                f"| {workload} | {r['system']} | {r['sentences_per_s']:.0f} | {engine:.2f} | "
                f"{around:.2f} | {engine + around:.2f} | {busy:.2f} |"
            )
    return lines


def _per_sentence(results: dict, system: str, workload: str, users: int) -> tuple[float, float]:
    """(engine, around it) CPU ms per sentence of one aggregated row."""
    row = next(
        r
        for r in results["rows"]
        if (r["system"], r["workload"], r["users"]) == (system, workload, users)
    )
    per = WORKLOADS[workload]
    engine, around = _engine_and_serving(row["cpu_ms_per_request"])
    return engine / per, around / per


def holds_back(results: dict) -> list[str]:
    """For each target missed, what holds it back, in CPU ms per sentence (per request for chat),
    computed from the same rows: the profile the issue asks for beside each miss."""
    meta, raw = results["meta"], results["raw"]
    users = sorted(meta["users"])
    middle = meta["middle"]
    cores = meta["cores"]
    at = {(r["system"], r["workload"], r["users"]): r for r in results["rows"]}

    def rate(system: str, workload: str, n: int = middle) -> float:
        return at[(system, workload, n)]["sentences_per_s"]

    def raw_ms(backend: str) -> float:
        return cores * 1000 / raw[backend]["sentences_per_s"]

    def against_raw(workload: str) -> str:
        engine, around = _per_sentence(results, STACK, workload, middle)
        return (
            f"the stack spends {engine + around:.2f} ms of CPU a sentence against raw's "
            f"{raw_ms('fp32'):.2f} ms of the cores' time (tokenizing and its best plan, in one "
            f"process): {engine:.2f} in the engine and {around:.2f} around it (HTTP, JSON, "
            f"tokenizing, planning, the hop to the runner, the lanes' work around each call)"
        )

    def against_fastapi(workload: str, needed: float) -> str:
        bound = raw["fp32"]["sentences_per_s"] / rate(FASTAPI, workload)
        engine, around = _per_sentence(results, FASTAPI, workload, middle)
        return (
            f"the raw engine serves {bound:.2f}x what the FastAPI server does here "
            f"(it spends {engine + around:.2f} ms a sentence: {engine:.2f} on its worker threads, "
            f"tokenizing and the engine, {around:.2f} on its event loop), "
            + (
                f"so {needed}x would need the stack above raw; "
                if bound < needed
                else f"so {needed}x is within the engine's reach; "
            )
            + against_raw(workload)
        )

    def chat_handwritten() -> str:
        ours = _per_sentence(results, STACK, "chat", middle)
        theirs = _per_sentence(results, HANDWRITTEN, "chat", middle)
        return (
            f"per request the stack spends {ours[0]:.2f} ms on the engine and {ours[1]:.2f} around "
            f"it, the hand-written server {theirs[0]:.2f} on its engine threads and {theirs[1]:.2f} "
            "on its event loop: one process, no hop"
        )

    def int8_chat() -> str:
        fp32, int8 = (_per_sentence(results, s, "chat", middle) for s in (STACK, INT8))
        return (
            f"the engine itself is {raw['int8']['sentences_per_s'] / raw['fp32']['sentences_per_s']:.2f}x "
            f"faster in int8 (raw); per request int8 spends {int8[0]:.2f} ms in the engine "
            f"against fp32's {fp32[0]:.2f}, and {int8[1]:.2f} ms around it against "
            f"fp32's {fp32[1]:.2f}: what is around the engine does not shrink with it"
        )

    def one_client() -> str:
        one = users[0]
        stack, fastapi = at[(STACK, "chat", one)], at[(FASTAPI, "chat", one)]
        cpu = {k: v["total_ms"] for k, v in stack["cpu_ms_per_request"].items() if v["total_ms"]}
        spent = "; ".join(f"{k} {v:.2f}" for k, v in cpu.items())
        theirs = sum(v["total_ms"] for v in fastapi["cpu_ms_per_request"].values())
        return (
            f"{stack['p50_ms'] - fastapi['p50_ms']:.1f} ms more at p50; the stack's CPU per "
            f"request at one client: {spent} ms (sum {sum(cpu.values()):.2f}), the FastAPI "
            f"server's {theirs:.2f}; beyond CPU, a request waits on two processes and the hop "
            "between their event loops"
        )

    def process_cpu(name: str, split: bool = False) -> str:
        v = at[(STACK, "chat", middle)]["cpu_ms_per_request"].get(name)
        if v is None:
            return f"no {name} process measured"
        said = (
            f"{name}: {v['main_ms']:.3f} ms on its main thread, {v['other_threads_ms']:.3f} on "
            "its other threads"
        )
        if "engine_ms" in v:
            said += (
                f", of which {v['engine_ms']:.3f} inside the engine calls: "
                f"{v['serving_ms']:.3f} outside the engine (the event loop, on the main thread, "
                "and the lanes around each call; each figure a median over the repeats, so the "
                "parts need not add up)"
            )
        elif split:
            said += (
                " (how much of those threads' CPU is inside the engine calls was not measured:"
                " this run's runner did not count its engine's CPU)"
            )
        traced = {
            r["users"]: r
            for r in results.get("paths", {}).get("rows", [])
            if r["system"] == BENTOML_PATH
        }.get(middle)
        if traced and name in traced["cpu_ms_per_request"]:
            said += (
                f"; on BentoML's own path (traced, access log on) "
                f"{traced['cpu_ms_per_request'][name]['main_ms']:.3f} on its main thread"
            )
        return said + "; its parts, by a sampling profiler: `make profile` (loadtests/README.md)"

    def failures() -> str:
        rows = [
            r
            for r in results["rows"]
            if r["system"] in (STACK, INT8) and r["users"] == middle and r["failures"] + r["shed"]
        ]
        return "; ".join(
            f"{r['system']} {r['workload']}: {r['failures']} failed, {r['shed']} shed" for r in rows
        )

    def loadgen() -> str:
        worst = max(every_row(results), key=lambda r: r["loadgen_cpu_share"])
        return (
            f"the most at {worst['system']} {worst['workload']} {worst['users']} users: "
            f"{worst['loadgen_cpu_share']:.1%} of the machine"
        )

    why = {
        "chat_raw": lambda: against_raw("chat"),
        "bulk_raw": lambda: against_raw("bulk"),
        "chat_fastapi": lambda: against_fastapi("chat", 1.75),
        "bulk_fastapi": lambda: against_fastapi("bulk", 2.5),
        "chat_handwritten": chat_handwritten,
        "int8_chat": int8_chat,
        "one_client": one_client,
        "tokenizer_cpu": lambda: process_cpu("tokenizer"),
        "runner_cpu": lambda: process_cpu("onnx_runner", split=True),
        "failures": failures,
        "loadgen": loadgen,
    }
    missed = [t for t in checked(results) if not t["met"]]
    if not missed:
        return []
    lines = ["", "What holds each missed target back (CPU ms, from the rows above):", ""]

    def explain(key: str) -> str:
        try:
            return why[key]()
        except (KeyError, StopIteration, RuntimeError, ZeroDivisionError):
            return "not explained: the rows it needs were not measured in this run"

    lines += [f"- **{t['target']}** ({t['measured']}): {explain(t['key'])}." for t in missed]
    return lines


def took(meta: dict, raw: dict) -> str:
    """ " The run took N minutes …", from start to end as recorded ("" for a run that did not
    record its start)."""
    import datetime as dt

    if "started" not in meta:
        return ""
    minutes = (
        dt.datetime.fromisoformat(meta["date"]) - dt.datetime.fromisoformat(meta["started"])
    ).total_seconds() / 60
    sweeps = "raw sweeps at its start and end" if "runs" in raw["fp32"] else "raw sweep"
    return f" The run took {minutes:.0f} minutes ({sweeps}, servers' start and every point)."


def tracing_cost(paths: dict) -> list[str]:
    """What turning ``trace_requests`` on costs (access log off), and the access log on top, from
    the lean-path rows: the main-thread CPU per request of the two processes a chat request goes
    through (both traced; the engine's threads are not) and the throughput, by users."""
    by = {(r["system"], r["users"]): r for r in paths["rows"]}

    def cpu(r: dict, process: str) -> float:  # the main thread: the engine's are not traced
        return r["cpu_ms_per_request"][process]["main_ms"]

    lines = []
    for users in sorted({u for _, u in by}):
        lean, traced, logged = (by.get((s, users)) for s in PATH_SYSTEMS)
        if not (lean and traced):
            continue
        costs = "; ".join(
            f"{process} {cpu(traced, process) - cpu(lean, process):+.3f} ms "
            f"({cpu(lean, process):.3f} → {cpu(traced, process):.3f})"
            for process in ("tokenizer", "onnx_runner")
        )
        said = (
            f"- {users} users: tracing on costs, in main-thread CPU per request, {costs}; it serves "
            f"{traced['sentences_per_s'] / lean['sentences_per_s']:.2f}× the lean path's "
            "sentences/s"
        )
        if logged:
            said += (
                f"; the access log on top adds {cpu(logged, 'tokenizer') - cpu(traced, 'tokenizer'):+.3f}"
                " ms to the tokenizer"
            )
        lines.append(said + ".")
    return (
        ["", "What the tracing setting costs (medians of the rows above):", "", *lines]
        if lines
        else []
    )


def _raw_runs(raw: dict) -> str:
    """How the limit was measured at the run's start and end, when it was (runs before that
    measured it once, at the start)."""
    if "runs" not in raw["fp32"]:
        return ""
    each = "; ".join(
        f"{backend} "
        + " and ".join(f"{run['sentences_per_s']:.0f}" for run in raw[backend]["runs"])
        for backend in ("fp32", "int8")
    )
    return f", the best of the run's start and end ({each})"


def unanswered(results: dict) -> list[str]:
    """Where a server answered nothing and nothing failed or was shed, each row named once. Read
    from each repeat where the record has them (``points``): a row whose medians are not zero can
    hold such a repeat, and its medians, spread and ratios count that repeat's zero."""
    points = results.get("points")
    silent: dict[tuple[str, str, int], int] = {}
    for p in points or results["rows"]:
        if not p["sentences_per_s"] and not p["failures"] and not p["shed"]:
            key = (p["system"], p["workload"], p["users"])
            silent[key] = silent.get(key, 0) + 1
    repeats = {(r["system"], r["workload"], r["users"]): r["repeats"] for r in results["rows"]}
    position = {key: i for i, key in enumerate(repeats)}  # the table's order
    named = []
    # In the table's order, not the points' (they come repeat by repeat).
    for (system, workload, users), count in sorted(
        silent.items(), key=lambda item: position.get(item[0], len(position))
    ):
        name, of = f"{system}, {workload} at {users} users", repeats.get((system, workload, users))
        if points and of and count < of:
            them = "that repeat" if count == 1 else "those repeats"
            name += (
                f", in {count} of its {of} repeats (the row's medians, spread and ratios "
                f"count {them} as 0)"
            )
        named.append(name)
    return named


def markdown(results: dict) -> str:
    raw, meta = results["raw"], results["meta"]
    lines = [
        f"Raw engine, in process: fp32 {raw['fp32']['sentences_per_s']:.0f} sentences/s (best plan: {raw['fp32']['plan']}), "
        f"int8 {raw['int8']['sentences_per_s']:.0f} ({raw['int8']['plan']}){_raw_runs(raw)}. {meta['repeats']} repeats of {meta['seconds_per_point']:.0f} s a chat point ({meta['seconds_per_point'] * BULK_LONGER:.0f} s a bulk, /classify or encoding point), "
        f"interleaved; medians, with the spread [min, max] of sentences/s.{took(meta, raw)}",
        "",
        "| workload | users | system | sentences/s [spread] | served/raw | stack ÷ this | p50 ms | p99 ms | failed | shed | CPU ms per request: main + other threads |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    stack_at = {
        (r["workload"], r["users"]): r["sentences_per_s"]
        for r in results["rows"]
        if r["system"] == STACK
    }
    for r in results["rows"]:
        limit = raw[backend_of(r["system"])]["sentences_per_s"]
        stack = stack_at.get((r["workload"], r["users"]))
        versus = f"{stack / r['sentences_per_s']:.2f}" if stack and r["sentences_per_s"] else "—"
        lines.append(
            f"| {r['workload']} | {r['users']} | {r['system']} | {r['sentences_per_s']:.0f} [{r['spread'][0]:.0f}, {r['spread'][1]:.0f}] "
            f"| {r['sentences_per_s'] / limit:.2f} | {versus} | {r['p50_ms']:.1f} | {r['p99_ms']:.0f} | {r['failures']} | {r['shed']} | {_cpu_cell(r)} |"
        )
    if restarted := results.get("restarts"):
        lines += [
            "",
            "Servers restarted between points because they had not worked off their queue in "
            f"{meta.get('settle_s', '?')} s (bench.settle; the next point of each measured a fresh "
            "process): " + ", ".join(f"{name} {n}x" for name, n in restarted.items()) + ".",
        ]
    if silent := unanswered(results):
        lines += [
            "",
            "No answer within the point (none of the point's requests failed: every connection's "
            "request was still waiting when it ended): " + ", ".join(silent) + ".",
        ]
    if (wire := results.get("encoding")) and "base64_over_float" in wire:
        share = wire["base64_over_float"]
        lines += [
            "",
            f'Vectors as base64 instead of JSON floats (`"encoding": "base64"`), stack, bulk: '
            f"{share['response_bytes']:.2f}× the bytes, {share['cpu_ms_per_request']:.2f}× the CPU per "
            f"request (all processes), {share['sentences_per_s']:.2f}× the sentences/s.",
            "",
            "| encoding | users | sentences/s [spread] | bytes per response | CPU ms per request: main + other threads |",
            "|---|---:|---:|---:|---|",
        ]
        lines += [
            f"| {e} | {r['users']} | {r['sentences_per_s']:.0f} [{r['spread'][0]:.0f}, {r['spread'][1]:.0f}] | {r['response_bytes']:,} | {_cpu_cell(r)} |"
            for e, r in wire["rows"].items()
        ]
    if (tenant := results.get("tenants")) and "heads_over_models" in tenant:
        share = tenant["heads_over_models"]
        lines += [
            "",
            f"/classify, one text per request, tenants drawn Zipf-style (s = 1.1) from "
            f"{results['meta'].get('tenants', '?')} demo tenants: head tenants serve "
            f"{share['requests_per_s']:.2f}× the requests/s of a whole model per tenant, at "
            f"{share['p99_ms']:.2f}× the p99 and {share['cpu_ms_per_request']:.2f}× the CPU per "
            "request (all processes).",
            "",
            "| tenants | users | requests/s [spread] | p50 ms | p99 ms | failed | shed | CPU ms per request: main + other threads |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        lines += [
            f"| {name} | {r['users']} | {r['sentences_per_s']:.0f} [{r['spread'][0]:.0f}, {r['spread'][1]:.0f}] | {r['p50_ms']:.1f} | {r['p99_ms']:.0f} | {r['failures']} | {r['shed']} | {_cpu_cell(r)} |"
            for name, r in tenant["rows"].items()
        ]
    if (paths := results.get("paths")) and paths["lean_over_bentoml"]:
        lines += [
            "",
            "The lean path against BentoML's own path, chat: the same graph with its hot routes "
            f"traced (`{TRACED_PATH}`: `BUNDLE_TOKENIZER_TRACE_REQUESTS`, "
            "`BUNDLE_ONNX_TRACE_REQUESTS`), and traced with the access log on too "
            f"(`{BENTOML_PATH}`: and `BUNDLE_TOKENIZER_ACCESS_LOG`):",
            "",
            "| users | system | sentences/s [spread] | p50 ms | p99 ms | CPU ms per request: main + other threads |",
            "|---:|---|---:|---:|---:|---|",
        ]
        lines += [
            f"| {r['users']} | {r['system']} | {r['sentences_per_s']:.0f} [{r['spread'][0]:.0f}, {r['spread'][1]:.0f}] | {r['p50_ms']:.1f} | {r['p99_ms']:.0f} | {_cpu_cell(r)} |"
            for r in sorted(
                paths["rows"],
                key=lambda r: (r["users"], PATH_SYSTEMS.index(r["system"])),
            )
        ]
        lines += tracing_cost(paths)
    lines += where_time_goes(results)
    checks = checked(results)
    lines += ["", "| target | met | measured |", "|---|---|---|"]
    lines += [
        f"| {t['target']} | {'yes' if t['met'] else '**no**'} | {t['measured']} |" for t in checks
    ]
    lines += holds_back(results)
    return "\n".join(lines)


def readme_block(recorded: Path) -> str:
    """loadtests/README.md's figures (markers included) as ``recorded``, a results JSON, gives them."""
    import json

    data = json.loads(recorded.read_text())
    meta = data["meta"]
    return (
        f"{BEGIN}\n<!-- generated by `make bench` (python -m loadtests.report {recorded.relative_to(ROOT)}); do not edit -->\n"
        f"### Measured {meta['date'][:10]}, {meta['machine']}, Python {meta['python']}, commit {meta['commit']}\n\n"
        f"Source: [`{recorded.relative_to(ROOT / 'loadtests')}`]({recorded.relative_to(ROOT / 'loadtests')}); load generator: {meta['load_generator']}.\n\n"
        f"{markdown(data)}\n{END}"
    )


def readme_figures() -> str:
    """The figures now between the markers in loadtests/README.md (markers included)."""
    return readme_blocks.read(BEGIN, END)


def update_readme(recorded: Path) -> None:
    """Replace the figures between the markers in loadtests/README.md with those of ``recorded``."""
    readme_blocks.replace(BEGIN, END, readme_block(recorded))


if __name__ == "__main__":
    update_readme(Path(sys.argv[1]).resolve())
