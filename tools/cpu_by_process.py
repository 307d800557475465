"""Where a command's CPU goes: every process on the machine, sampled while the command runs,
grouped by what it is (a BentoML worker by its service, pytest, Docker's engine, ...).

    python -m tools.cpu_by_process [--interval S] [--out JSON] -- COMMAND [ARG...]

Every process counts, not only the command's descendants: BentoML's workers call ``setsid`` and a
container's processes are children of Docker's engine, not of the command (a container's BentoML
worker falls in the same group as one on the host). A process already running when the run
starts counts only the CPU it uses after. The machine's busy time (every core's user, system and
interrupt time) is printed beside the sum; the difference is what no sample saw: processes that
lived less than one interval (a container's health probe, a short CLI call), the CPU a process
used after its last sample, and the kernel's interrupt handling.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

# (pattern on the command line, group), first match wins: the servers under test, then the tools
# the tests run (their command lines often name a path under pytest's temporary folder), then
# pytest itself.
GROUPS = (
    (r"--service-name (\w+)", "BentoML worker: {0}"),
    (r"bentoml serve", "BentoML arbiter"),
    (r"uvicorn", "uvicorn (baseline servers)"),
    (r"^\S*(haproxy|prometheus)\b", "HAProxy, Prometheus"),
    (r"-m models\.(build|parity)\b", "model builds and parity runs"),
    (r"bentoml (build|containerize)|-m deploy\.bentos\b", "bento builds"),
    (r"\bpip\b|pip_compileall|^\S*/?uv\b", "package installs (bytecode compiled)"),
    (r"\b(mypy|pylint|ruff|lint-imports)\b", "lint"),
    (r"^\S*/?(wrk|locust)\b|/locust\s|-m locust\b", "load generators"),
    (
        r"^\S*/?(dockerd|containerd\S*|runc|docker\S*)\b|docker-compose",
        "Docker's engine, CLI, image builds",
    ),
    (r"-m pytest\b|/pytest\s|import sys;exec\(eval\(sys\.stdin", "pytest (and its xdist workers)"),
    (r"python", "other Python (tests' servers, clients, probes)"),
    (r"^\[", "the kernel's threads"),
)


def group(cmdline: str) -> str:
    """The group a process's command line belongs to (``other: <program>`` where none matches)."""
    for pattern, name in GROUPS:
        if match := re.search(pattern, cmdline):
            return name.format(*match.groups())
    return f"other: {Path(cmdline.split()[0]).name}" if cmdline.strip() else "other"


@dataclass
class Seen:
    pid: int
    cmdline: str  # a kernel thread, which has none: its name in brackets, as ps shows it
    cpu_at_start: float  # CPU seconds used before the run started (0 if it started during it)
    cpu: float  # CPU seconds at the last sample


def machine_busy_s() -> float:
    """CPU seconds every core has been busy since boot: user (a guest's included), nice, system
    and interrupts; not idle, iowait, or steal (another machine's use of this one's cores)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def sample(seen: dict[tuple[int, float], Seen], run_started: float, first: bool = False) -> None:
    """Every process's CPU now, into ``seen`` (by PID and start time: a PID can be reused). A
    process counts as running before the run if the first sample saw it, or if it started well
    before (one the first sample missed): psutil's start times rest on a boot time in whole
    seconds, so one started just after the run may read as just before."""
    for proc in psutil.process_iter(["cmdline", "name", "create_time", "cpu_times"]):
        info = proc.info
        if info["cpu_times"] is None or info["create_time"] is None:
            continue  # gone, or not ours to read
        cpu = info["cpu_times"].user + info["cpu_times"].system
        key = (proc.pid, info["create_time"])
        if key not in seen:
            cmdline = " ".join(info["cmdline"] or []) or f"[{info['name'] or '?'}]"
            older = first or info["create_time"] < run_started - 2
            before = cpu if older else 0.0
            seen[key] = Seen(proc.pid, cmdline, before, cpu)
        seen[key].cpu = cpu


def run(
    argv: list[str], interval_s: float
) -> tuple[int, dict[str, float], dict[tuple[int, float], Seen]]:
    """Run ``argv``, sampling every process each ``interval_s``; its exit status (128 + the
    signal's number where a signal ended it, as a shell gives it), the machine's figures (wall and
    busy seconds) and every process seen."""
    seen: dict[tuple[int, float], Seen] = {}
    busy, started, run_started = machine_busy_s(), time.monotonic(), time.time()
    sample(seen, run_started, first=True)
    proc = subprocess.Popen(argv)
    try:
        while proc.poll() is None:
            time.sleep(interval_s)
            sample(seen, run_started)
    except KeyboardInterrupt:  # the command got the terminal's SIGINT too: its figures so far
        proc.wait()
    machine = {"wall_s": time.monotonic() - started, "busy_s": machine_busy_s() - busy}
    status = proc.returncode
    return (128 - status if status < 0 else status), machine, seen


def table(machine: dict[str, float], seen: dict[tuple[int, float], Seen]) -> str:
    """The CPU each group used during the run, most first, as a Markdown table."""
    cpu: defaultdict[str, float] = defaultdict(float)
    count: Counter[str] = Counter()
    for process in seen.values():
        used = process.cpu - process.cpu_at_start
        if used > 0:
            name = group(process.cmdline)
            cpu[name] += used
            count[name] += 1
    most_first = sorted(cpu.items(), key=lambda item: -item[1])
    wall, busy, total = machine["wall_s"], machine["busy_s"], sum(cpu.values())
    lines = [
        f"{int(wall // 60)}:{int(wall % 60):02d}, the machine busy {busy / 60:.1f} CPU-minutes "
        f"({busy / max(wall, 1e-9):.2f} cores on average); in the processes seen {total / 60:.1f}",
        "| group | CPU-minutes | processes |",
        "|---|---:|---:|",
        *(f"| {name} | {s / 60:.2f} | {count[name]} |" for name, s in most_first),
        f"| not seen by a sample | {(busy - total) / 60:.2f} | |",
    ]
    return "\n".join(lines)


def positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
    return value


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=positive, default=2.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, help="also write every process seen (JSON)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    opts = parser.parse_args(args)
    command = opts.command[1:] if opts.command[:1] == ["--"] else opts.command
    if not command:
        parser.error("no command to run (give it after --)")
    try:
        status, machine, seen = run(command, opts.interval)
    except OSError as exc:  # the command could not be started
        print(f"error: cannot run {command[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    print(table(machine, seen), file=sys.stderr)
    if opts.out:
        processes = [asdict(p) for p in seen.values()]
        opts.out.write_text(json.dumps({**machine, "processes": processes}, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
