"""Where a command's CPU goes: every process on the machine, sampled while the command runs,
grouped by what it is (a BentoML worker by its service, pytest, Docker's engine, ...).

    python -m tools.cpu_by_process [--interval S] [--out JSON] -- COMMAND [ARG...]

Every process counts, not only the command's descendants: BentoML's workers call ``setsid`` and a
container's processes are children of Docker's engine, not of the command. A process alive when
the run starts counts only the CPU it uses after. A process that lives less than one interval may
never be seen (a container's health probe, a short CLI call): the machine's whole busy time
(``/proc/stat``) is printed beside the sum, and the difference is what the samples missed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

# (pattern on the command line, group), first match wins: the servers under test, then the
# processes of the tests and the tools around them.
GROUPS = (
    (r"--service-name (\w+)", "BentoML worker: {0}"),
    (r"bentoml serve", "BentoML arbiter"),
    (r"uvicorn", "uvicorn (baseline servers)"),
    (r"haproxy|prometheus", "HAProxy, Prometheus"),
    (r"pytest|import sys;exec\(eval", "pytest (and its xdist workers)"),
    (r"models\.(build|parity)", "model builds and parity runs"),
    (r"bentoml (build|containerize)|buildkit", "bento and image builds"),
    (r"pip|/uv ", "package installs (bytecode compiled)"),
    (r"mypy|pylint|ruff|lint-imports", "lint"),
    (r"locust|wrk", "load generators"),
    (r"^\S*/?(dockerd|containerd|runc|docker)\b|docker-compose", "Docker's engine and CLI"),
    (r"python", "other Python (tests' servers, clients, probes)"),
)


def group(cmdline: str) -> str:
    """The group a process's command line belongs to (``other: <program>`` where none matches)."""
    for pattern, name in GROUPS:
        if match := re.search(pattern, cmdline):
            return name.format(*match.groups())
    return f"other: {Path(cmdline.split()[0]).name}" if cmdline.strip() else "other"


@dataclass
class Seen:
    cmdline: str
    cpu_at_start: float  # CPU seconds already used when the run started (0 if it started later)
    cpu: float  # CPU seconds at the last sample


def machine_busy_s() -> float:
    """CPU seconds the machine has been busy since boot, all cores: all but idle and iowait."""
    with open("/proc/stat") as stat:
        ticks = [int(t) for t in stat.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def sample(seen: dict[tuple[int, float], Seen], first: bool) -> None:
    for proc in psutil.process_iter(["cmdline", "name", "create_time", "cpu_times"]):
        info = proc.info
        if info["cpu_times"] is None or info["create_time"] is None:
            continue  # gone, or not ours to read
        cpu = info["cpu_times"].user + info["cpu_times"].system
        key = (proc.pid, info["create_time"])
        if key not in seen:
            cmdline = " ".join(info["cmdline"] or [info["name"] or ""])
            seen[key] = Seen(cmdline, cpu if first else 0.0, cpu)
        seen[key].cpu = cpu


def run(argv: list[str], interval_s: float) -> tuple[int, dict, dict[tuple[int, float], Seen]]:
    """Run ``argv``, sampling every process each ``interval_s``; its exit status, the machine's
    figures (wall and busy seconds) and every process seen."""
    seen: dict[tuple[int, float], Seen] = {}
    busy, started = machine_busy_s(), time.monotonic()
    sample(seen, first=True)
    proc = subprocess.Popen(argv)
    while proc.poll() is None:
        time.sleep(interval_s)
        sample(seen, first=False)
    machine = {"wall_s": time.monotonic() - started, "busy_s": machine_busy_s() - busy}
    return proc.returncode, machine, seen


def table(machine: dict, seen: dict[tuple[int, float], Seen]) -> str:
    """The CPU each group used during the run, most first, as a Markdown table."""
    cpu: defaultdict[str, float] = defaultdict(float)
    count: Counter[str] = Counter()
    for process in seen.values():
        used = process.cpu - process.cpu_at_start
        if used > 0:
            cpu[group(process.cmdline)] += used
            count[group(process.cmdline)] += 1
    most_first = sorted(cpu.items(), key=lambda item: -item[1])
    wall, busy, total = machine["wall_s"], machine["busy_s"], sum(cpu.values())
    lines = [
        f"{int(wall // 60)}:{int(wall % 60):02d}, the machine busy {busy / 60:.1f} CPU-minutes "
        f"({busy / wall:.2f} cores on average); in the processes seen {total / 60:.1f}",
        "| group | CPU-minutes | processes |",
        "|---|---:|---:|",
        *(f"| {name} | {s / 60:.2f} | {count[name]} |" for name, s in most_first),
        f"| not seen (processes shorter than a sample) | {max(busy - total, 0) / 60:.2f} | |",
    ]
    return "\n".join(lines)


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, help="also write every process seen (JSON)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    opts = parser.parse_args(args)
    command = opts.command[1:] if opts.command[:1] == ["--"] else opts.command
    if not command:
        parser.error("no command to run (give it after --)")
    status, machine, seen = run(command, opts.interval)
    print(table(machine, seen), file=sys.stderr)
    if opts.out:
        processes = [asdict(p) for p in seen.values()]
        opts.out.write_text(json.dumps({**machine, "processes": processes}, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
