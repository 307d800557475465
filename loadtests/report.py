"""The benchmark's report: ratios to the raw engine and to the other systems, the markdown table,
the targets and the plots."""

from __future__ import annotations

from pathlib import Path

from loadtests.points import (
    FASTAPI,
    INT8,
    MIDDLE,
    NAIVE,
    NOBATCH,
    OUT,
    STACK,
    SYSTEMS,
    USERS,
    WORKLOADS,
    Point,
)


def ratios(points: list[Point], raw: float) -> list[dict]:
    table = {(p.system, p.workload, p.users): p.sentences_per_s for p in points}
    out = []
    for workload in WORKLOADS:
        for users in USERS:
            stack = table[(STACK, workload, users)]
            row = {
                "workload": workload,
                "users": users,
                "stack_sentences_per_s": stack,
                "raw_sentences_per_s": raw,
            }
            row["served_over_raw"] = stack / raw
            for name, system in (
                ("vs_fastapi", FASTAPI),
                ("vs_naive", NAIVE),
                ("vs_batching_off", NOBATCH),
            ):
                other = table.get((system, workload, users))
                row[name] = stack / other if other else None
            if (INT8, workload, users) in table:
                row["int8_over_fp32"] = table[(INT8, workload, users)] / stack
            out.append(row)
    return out


def markdown(points: list[Point], rows: list[dict], raw: dict) -> str:
    lines = [
        f"Raw engine (fp32, in process, sorted batches of {raw['fp32']['batch_size']}): "
        f"{raw['fp32']['sentences_per_s']:.0f} sentences/s; int8: {raw['int8']['sentences_per_s']:.0f} "
        f"({raw['int8']['sentences_per_s'] / raw['fp32']['sentences_per_s']:.2f}x).",
        "",
        "| workload | users | system | sentences/s | p50 ms | p99 ms | failures | shed | load-gen CPU | served/raw | stack ÷ this |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_key = {(r["workload"], r["users"]): r for r in rows}
    for p in sorted(
        points, key=lambda p: (list(WORKLOADS).index(p.workload), p.users, SYSTEMS.index(p.system))
    ):
        row = by_key[(p.workload, p.users)]
        stack = row["stack_sentences_per_s"]
        if not p.requests:  # nothing completed within the window (latency longer than the point)
            lines.append(f"| {p.workload} | {p.users} | {p.system} | 0 | — | — | {p.failures} | {p.shed} | "
                         f"{p.loadgen_cpu_share:.0%} | 0.00 | — |")  # fmt: skip
            continue
        lines.append(
            f"| {p.workload} | {p.users} | {p.system} | {p.sentences_per_s:.0f} | {p.p50_ms:.0f} | {p.p99_ms:.0f} | "
            f"{p.failures} | {p.shed} | {p.loadgen_cpu_share:.0%} | {p.sentences_per_s / row['raw_sentences_per_s']:.2f} | "
            f"{stack / p.sentences_per_s if p.sentences_per_s else float('nan'):.2f} |"
        )
    return "\n".join(lines)


def targets(rows: list[dict], points: list[Point]) -> list[tuple[str, bool, str]]:
    at = {(r["workload"], r["users"]): r for r in rows}
    # A shed request is a failure to the client that sent it: both count here.
    failures = sum(p.failures + p.shed for p in points if p.users == MIDDLE and p.system == STACK)
    int8 = [r["int8_over_fp32"] for r in rows if r.get("int8_over_fp32")]
    best = {w: max(r["served_over_raw"] for r in rows if r["workload"] == w) for w in WORKLOADS}
    checks = [
        ("bulk served/raw >= 0.90 (best point)", best["bulk"] >= 0.90, f"{best['bulk']:.2f}"),
        ("chat served/raw >= 0.70 (best point)", best["chat"] >= 0.70, f"{best['chat']:.2f}"),
    ]
    for w in WORKLOADS:
        r = at[(w, MIDDLE)]
        checks.append(
            (
                f"{w} at {MIDDLE} users >= 1.75x fastapi",
                (r["vs_fastapi"] or 0) >= 1.75,
                f"{r['vs_fastapi']:.2f}x",
            )
        )
        checks.append(
            (
                f"{w} at {MIDDLE} users >= 2.5x naive bentoml",
                (r["vs_naive"] or 0) >= 2.5,
                f"{r['vs_naive']:.2f}x",
            )
        )
    checks.append((f"stack at {MIDDLE} users: 0 failures", failures == 0, str(failures)))
    checks.append(
        (
            f"int8 >= 1.5x fp32 (served, {MIDDLE} users)",
            bool(int8) and min(int8) >= 1.5,
            ", ".join(f"{x:.2f}x" for x in int8),
        )
    )
    return checks


def plot(points: list[Point], raw: float) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for workload in WORKLOADS:
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
        for system in SYSTEMS:
            series = sorted(
                (p for p in points if p.system == system and p.workload == workload),
                key=lambda p: p.users,
            )
            if len(series) < 2:
                continue
            users = [p.users for p in series]
            left.plot(users, [p.sentences_per_s for p in series], marker="o", label=system)
            (line,) = right.plot(
                users, [p.p50_ms for p in series], marker="o", label=f"{system} p50"
            )
            right.plot(
                users,
                [p.p99_ms for p in series],
                marker="x",
                linestyle="--",
                color=line.get_color(),
                label=f"{system} p99",
            )
        left.axhline(raw, color="black", linestyle=":", label="raw engine")
        left.set(
            title=f"{workload}: throughput", xlabel="users", ylabel="sentences/s", xticks=USERS
        )
        right.set(
            title=f"{workload}: latency", xlabel="users", ylabel="ms", yscale="log", xticks=USERS
        )
        left.legend(fontsize=8)
        right.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = OUT / f"{workload}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
