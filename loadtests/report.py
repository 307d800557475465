"""The benchmark's report: points aggregated over repeats (median and spread), ratios to each
backend's raw limit and to the other systems, per-request CPU, the targets, and the table.

    python -m loadtests.report loadtests/results/DATE.json    # regenerate loadtests/results/results.md
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path

from loadtests.points import (
    BULK_LONGER,
    FASTAPI,
    HANDWRITTEN,
    INT8,
    NAIVE,
    NOBATCH,
    STACK,
    SYSTEMS,
    WORKLOADS,
    Point,
)
from loadtests.targets import targets
from testkit.processes import ROOT

RESULTS = ROOT / "loadtests" / "results"
RESULTS_MD = RESULTS / "results.md"


# The stack's ratios to the other systems, by the name each has in a run's ratios.
VERSUS = {"vs_fastapi": FASTAPI, "vs_naive": NAIVE, "vs_batching_off": NOBATCH,
          "vs_handwritten": HANDWRITTEN}  # fmt: skip


def backend_of(system: str) -> str:
    return "int8" if system == INT8 else "fp32"


def _median_cpu(rows: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each process's figures, the median over the repeats that measured it; a figure only some
    repeats have (the engine split, where a runner's counter could not be read) is left out."""
    out = {}
    for name in sorted({name for row in rows for name in row}):
        measured = [r[name] for r in rows if name in r]
        keys = [k for k in measured[0] if all(k in m for m in measured)]
        out[name] = {k: round(statistics.median(m[k] for m in measured), 4) for k in keys}
    return out


def table(points: list[Point]) -> list[dict]:
    """One row per (system, workload, users): medians over the repeats, and the spread; in the
    table's order: workload, users, system."""
    groups: dict[tuple[str, str, int], list[Point]] = defaultdict(list)
    for p in points:
        groups[(p.system, p.workload, p.users)].append(p)
    rows = []
    for (system, workload, users), ps in groups.items():
        rates = [p.sentences_per_s for p in ps]
        rows.append({
            "system": system, "workload": workload, "users": users, "repeats": len(ps),
            "sentences_per_s": round(statistics.median(rates), 2),
            "spread": [round(min(rates), 2), round(max(rates), 2)],
            "p50_ms": round(statistics.median(p.p50_ms for p in ps), 2),
            "p99_ms": round(statistics.median(p.p99_ms for p in ps), 2),
            "failures": sum(p.failures for p in ps), "shed": sum(p.shed for p in ps),
            "loadgen_cpu_share": round(max(p.loadgen_cpu_share for p in ps), 4),
            "cpu_ms_per_request": _median_cpu([p.cpu_ms_per_request for p in ps]),
        })  # fmt: skip
    workloads = list(WORKLOADS)
    return sorted(
        rows, key=lambda r: (workloads.index(r["workload"]), r["users"], SYSTEMS.index(r["system"]))
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
        for name, system in VERSUS.items():
            other = at.get((system, workload, users))
            row[name] = round(stack / other, 4) if other else None
        out.append(row)
    return out


def results(points: list[Point], raw: dict, meta: dict) -> dict:
    rows = table(points)
    # restarts: servers restarted before a point, the last one's queue not worked off (bench.settle)
    run = {"meta": meta, "raw": raw, "rows": rows, "ratios": ratios(rows, raw),
           "points": [asdict(p) for p in points], "restarts": restarts(points)}  # fmt: skip
    return {**run, "targets": checked(run)}


def points_of(run: dict) -> list[Point]:
    """A recorded run's points (fields a later ``Point`` no longer has are left out)."""
    fields = Point.__dataclass_fields__
    return [Point(**{k: v for k, v in p.items() if k in fields}) for p in run["points"]]


def restarts(points: list[Point]) -> dict[str, int]:
    """How many points each server was restarted before (loadtests.bench.settle), by name."""
    return dict(sorted(Counter(name for p in points for name in p.restarted).items()))


def checked(results: dict) -> list[dict]:
    """The targets, checked again from the run's rows (a recorded run renders with today's)."""
    meta = results["meta"]
    return targets(results["rows"], results["ratios"], sorted(meta["users"]), meta["middle"])


# How far a quick run's served figure may pass its raw limit before the limit is called wrong: its
# one timing of a plan of each kind on ~300 texts (the embedding rows' at start and end, the best
# kept) can fall a few percent under a served point in a shared host's slower minutes; a wrong
# limit (a plan, thread layout or inputs not the stack's) misses by more. A full run allows none.
QUICK_SLACK = 0.2


def above_raw(results: dict, slack: float | None = None) -> list[str]:
    """Served figures above their backend's raw limit (a rerank or classify row: its model's) by
    more than ``slack`` (by default ``QUICK_SLACK`` in a quick run, else none): the limit would be
    wrong."""
    if slack is None:
        slack = QUICK_SLACK if results["meta"].get("quick") else 0.0
    slack += 1
    return [
        f"{r['system']} {r['workload']} {r['users']}: {r['sentences_per_s']:.0f} > {limit:.0f}"
        for r in results["rows"]
        if r["sentences_per_s"]
        > slack * (limit := results["raw"][backend_of(r["system"])]["sentences_per_s"])
    ] + [
        f"{t['task']} {t['model']} {t['users']}: {t['served_per_s']:.0f} > {t['raw_per_s']:.0f}"
        for t in results.get("tasks", [])
        if t["served_per_s"] > slack * t["raw_per_s"]
    ]


def _cpu_cell(row: dict) -> str:
    cpu = row["cpu_ms_per_request"].items()
    return "; ".join(f"{name} {v['main_ms']:.2f}+{v['other_threads_ms']:.2f}"
                     for name, v in cpu if v["total_ms"] >= 0.005)  # fmt: skip


def where_time_goes(results: dict) -> list[str]:
    """Per sentence at the middle load, each system's CPU on the engine and around it, and raw's."""
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
            lines.append(
                f"| {workload} | raw {backend} | {rate:.0f} | — | — | "
                f"{cores * 1000 / rate:.2f} | {cores} (all) |"
            )
        for r in results["rows"]:
            if r["workload"] != workload or r["users"] != users:
                continue
            cpu = r["cpu_ms_per_request"]
            runners = [v for name, v in cpu.items() if name not in ("tokenizer", "NaiveFront")]
            engine = sum(v.get("engine_ms", v["other_threads_ms"]) for v in runners) / per
            total = sum(v["total_ms"] for v in cpu.values()) / per
            lines.append(
                f"| {workload} | {r['system']} | {r['sentences_per_s']:.0f} | {engine:.2f} | "
                f"{total - engine:.2f} | {total:.2f} | {total * r['sentences_per_s'] / 1000:.2f} |"
            )
    return lines


def markdown(results: dict) -> str:
    raw, meta = results["raw"], results["meta"]
    limits = ", ".join(f"{backend} {limit['sentences_per_s']:.0f} sentences/s (best plan: "
                       f"{limit['plan']})" for backend, limit in raw.items())  # fmt: skip
    lines = [
        f"Raw engine, in process: {limits}. {meta['repeats']} repeats of "
        f"{meta['seconds_per_point']:.0f} s a chat point ({meta['seconds_per_point'] * BULK_LONGER:.0f}"
        " s a bulk point), interleaved; medians, with the spread [min, max] of sentences/s.",
        "",
        "| workload | users | system | sentences/s [spread] | served/raw | stack ÷ this | p50 ms | p99 ms | failed | shed | CPU ms per request: main + other threads |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    stack_at = {(r["workload"], r["users"]): r["stack_sentences_per_s"] for r in results["ratios"]}
    for r in results["rows"]:
        limit = raw[backend_of(r["system"])]["sentences_per_s"]
        stack = stack_at.get((r["workload"], r["users"]))
        versus = f"{stack / r['sentences_per_s']:.2f}" if stack and r["sentences_per_s"] else "—"
        rate = "no answer" if not r["sentences_per_s"] else f"{r['sentences_per_s']:.0f}"
        lines.append(
            f"| {r['workload']} | {r['users']} | {r['system']} | {rate} [{r['spread'][0]:.0f}, {r['spread'][1]:.0f}] "
            f"| {r['sentences_per_s'] / limit:.2f} | {versus} | {r['p50_ms']:.1f} | {r['p99_ms']:.0f} | {r['failures']} | {r['shed']} | {_cpu_cell(r)} |"
        )
    if restarted := results.get("restarts"):
        lines += [
            "",
            "Servers restarted between points because they had not worked off their queue in "
            f"{meta.get('settle_s', '?')} s (bench.settle; the next point of each measured a fresh "
            "process): " + ", ".join(f"{name} {n}x" for name, n in restarted.items()) + ".",
        ]
    if several := results.get("several_models"):
        lines += ["", several_models(several)]
    if rows := results.get("tasks"):
        lines += ["", *task_rows(rows)]
    lines += where_time_goes(results)
    lines += ["", "| target | met | measured |", "|---|---|---|"]
    lines += [
        f"| {t['target']} | {'yes' if t['met'] else '**no**'} | {t['measured']} |"
        for t in checked(results)
    ]
    return "\n".join(lines)


def several_models(figures: dict) -> str:
    """One model's one-sentence p99 alone and beside another saturated (loadtests/isolation.py)."""
    return (
        f"Several models on one graph: {figures['model_b']}'s one-sentence requests (1 client) "
        f"p99 {figures['b_alone_p99_ms']:.1f} ms alone, {figures['b_beside_a_p99_ms']:.1f} ms with "
        f"{figures['model_a']} saturated by bulk requests ({figures['a_sentences_per_s']:.0f} "
        f"sentences/s, {figures['a_shed']} shed): {figures['b_p99_ratio']:.2f}x; p50 "
        f"{figures['b_alone_p50_ms']:.1f} and {figures['b_beside_a_p50_ms']:.1f} ms."
    )


def task_rows(rows: list[dict]) -> list[str]:
    """The rerank and classify rows (loadtests/tasks.py): inputs (pairs, texts) a second served
    against the raw engine on the same inputs, and each process's CPU per request."""
    lines = [
        "Rerank and classify (each request 32 inputs: a query's pairs, or texts; served at "
        f"{rows[0]['users']} users):",
        "",
        "| task | model | route | served inputs/s | raw | served/raw | p50 ms | p99 ms | failed | shed | CPU ms/request (main+other threads) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['model']} | {r['route']} | {r['served_per_s']:.0f} | "
            f"{r['raw_per_s']:.0f} ({r['raw_plan']}) | {r['served_over_raw']:.2f} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.0f} | {r['failures']} | {r['shed']} | {_cpu_cell(r)} |"
        )
    return lines


def results_md(recorded: Path) -> str:
    """loadtests/results/results.md as the record ``recorded`` (a results JSON) gives it."""
    data = json.loads(recorded.read_text())
    meta = data["meta"]
    return (
        f"<!-- generated by `make bench` (python -m loadtests.report {recorded.relative_to(ROOT)}); "
        "do not edit -->\n"
        f"# Measured {meta['date'][:10]}, {meta['machine']}, Python {meta['python']}, "
        f"commit {meta['commit']}\n\n"
        f"Source: [`{recorded.name}`]({recorded.name}); load generator: {meta['load_generator']}.\n\n"
        f"{markdown(data)}\n"
    )


def write_results_md(recorded: Path) -> Path:
    RESULTS_MD.write_text(results_md(recorded))
    return RESULTS_MD


if __name__ == "__main__":
    print(f"written: {write_results_md(Path(sys.argv[1]).resolve())}")
