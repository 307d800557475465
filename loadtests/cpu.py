"""CPU time of a server's processes, per thread, from /proc: what a request costs, process by process.

Main thread and other threads apart, and, where a runner counts its engine's CPU, ``engine_ms``
and ``serving_ms`` (loadtests/README.md, "make bench").
"""

from __future__ import annotations

import os
import platform
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from testkit.processes import Server

# The instruction sets ONNX Runtime's kernels (MLAS) are chosen by: int8's gain over fp32 depends
# on them (VNNI has int8 dot-product instructions that AVX2 lacks).
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")


def machine(cpuinfo: str | None = None) -> str:
    """This machine as a benchmark record names it: architecture, cores, the CPU's model and the
    instruction sets of ``ISA_FLAGS`` it has (from ``/proc/cpuinfo``), and the OS."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():  # the first processor's values: its block names them all
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    cpu = fields.get("model name") or platform.processor() or "CPU model unknown"
    if "cpu family" in fields:
        cpu += f", family {fields['cpu family']} model {fields.get('model', '?')}"
    if flags:
        isa = " ".join(f for f in ISA_FLAGS if f in flags) or "none of " + "/".join(ISA_FLAGS)
        cpu += ", " + isa
    return f"{platform.machine()}, {os.cpu_count()} cores, {cpu}, {platform.platform()}"


TICKS = os.sysconf("SC_CLK_TCK")
ENGINE_CPU = "bundle_engine_cpu_seconds"  # the runners' counter of their engines' CPU


@dataclass(frozen=True)
class Usage:
    main_s: float  # the main thread (tid == pid)
    other_s: float  # every other thread


def usage(pid: int) -> Usage:
    main = other = 0.0
    for entry in os.scandir(f"/proc/{pid}/task"):
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
        seconds = (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime
        if int(entry.name) == pid:
            main = seconds
        else:
            other += seconds
    return Usage(main, other)


def wakeups(pid: int) -> int:
    """Context switches so far of every thread of ``pid``: each time a thread gave up the CPU,
    voluntarily (it sleeps until woken: a timer, a poll, I/O) or not. At rest, their rate is how
    often the process wakes up."""
    total = 0
    for entry in os.scandir(f"/proc/{pid}/task"):
        try:
            status = Path(entry.path, "status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
        for line in status.splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


def label(proc: psutil.Process) -> str:
    """A process's role: the BentoML service it serves, or its program."""
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return str(proc.pid)
    if "--service-name" in argv[:-1]:
        return argv[argv.index("--service-name") + 1]
    if any("uvicorn" in a for a in argv[:2]):
        return "uvicorn"
    return (
        "bentoml serve (arbiter)" if any(a.endswith("bentoml") for a in argv[:2]) else proc.name()
    )


def workers(server: Server, service: str) -> list[psutil.Process]:
    """The worker processes serving ``service`` in a `bentoml serve` graph."""
    return [proc for proc in server.descendants() if label(proc) == service]


def processes(server: Server) -> list[psutil.Process]:
    """The server's process and its live descendants (``Server.descendants``)."""
    return [server.process(), *server.descendants()]


def snapshot(server: Server) -> dict[int, tuple[str, Usage]]:
    out = {}
    for proc in processes(server):
        try:
            out[proc.pid] = (label(proc), usage(proc.pid))
        except (FileNotFoundError, ProcessLookupError, psutil.Error):
            continue
    return out


def engine_seconds(url: str) -> dict[str, float]:
    """Engine CPU seconds so far of each runner (by service name), from the server's ``/metrics``
    (the front service's page has the runners' series too: one multiprocess directory a graph).
    Empty for a server without the counter (the baselines), or without /metrics."""
    resp = httpx.get(f"{url}/metrics", timeout=30)
    return engine_seconds_in(resp.text) if resp.is_success else {}


def engine_seconds_in(exposition: str) -> dict[str, float]:
    """``engine_seconds`` from a Prometheus text exposition: each runner's models added up."""
    out: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(exposition):
        if family.name == ENGINE_CPU:
            for sample in family.samples:
                if sample.name == f"{ENGINE_CPU}_total":
                    out[sample.labels["runner"]] += sample.value
    return dict(out)


def per_request(
    before: dict[int, tuple[str, Usage]],
    after: dict[int, tuple[str, Usage]],
    requests: int,
    engine: tuple[dict[str, float], dict[str, float]] = ({}, {}),
) -> dict[str, dict[str, float]]:
    """CPU milliseconds per request of each role (several workers added up) between two snapshots,
    main thread and other threads apart; with ``engine``, the runners' ``engine_seconds`` at the
    same two moments, a role that counts it gains ``engine_ms`` and ``serving_ms`` (the rest)."""
    out: dict[str, dict[str, float]] = {}
    for pid, (name, end) in after.items():
        if pid not in before or not requests:
            continue
        start = before[pid][1]
        row = out.setdefault(name, {"total_ms": 0.0, "main_ms": 0.0, "other_threads_ms": 0.0})
        main = (end.main_s - start.main_s) * 1000 / requests
        other = (end.other_s - start.other_s) * 1000 / requests
        row["main_ms"] += main
        row["other_threads_ms"] += other
        row["total_ms"] += main + other
    start_engine, end_engine = engine
    for name, row in out.items():
        if name in end_engine:
            row["engine_ms"] = (end_engine[name] - start_engine.get(name, 0.0)) * 1000 / requests
            row["serving_ms"] = row["total_ms"] - row["engine_ms"]
    return {name: {k: round(v, 4) for k, v in row.items()} for name, row in out.items()}
