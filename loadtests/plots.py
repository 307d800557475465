"""The benchmark's plots: throughput, p50 and p99 latency against users, one PNG per workload."""

from __future__ import annotations

from pathlib import Path

from loadtests.points import SYSTEMS, WORKLOADS


def plot(results: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    users = results["meta"]["users"]
    for workload in WORKLOADS:
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
        for system in SYSTEMS:
            series = sorted(
                (r for r in results["rows"] if r["system"] == system and r["workload"] == workload),
                key=lambda r: r["users"],
            )
            if len(series) < 2:
                continue
            xs = [r["users"] for r in series]
            left.plot(xs, [r["sentences_per_s"] for r in series], marker="o", label=system)
            (line,) = right.plot(
                xs, [r["p50_ms"] for r in series], marker="o", label=f"{system} p50"
            )
            right.plot(
                xs,
                [r["p99_ms"] for r in series],
                marker="x",
                linestyle="--",
                color=line.get_color(),
                label=f"{system} p99",
            )
        left.axhline(
            results["raw"]["fp32"]["sentences_per_s"],
            color="black",
            linestyle=":",
            label="raw engine, fp32",
        )
        left.set(
            title=f"{workload}: throughput",
            xlabel="users",
            ylabel="sentences/s",
            xscale="symlog",
            xticks=users,
            xticklabels=users,
        )
        right.set(
            title=f"{workload}: latency",
            xlabel="users",
            ylabel="ms",
            yscale="log",
            xscale="symlog",
            xticks=users,
            xticklabels=users,
        )
        left.legend(fontsize=8)
        right.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        path = out / f"{workload}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
