"""Where a one-sentence request's CPU goes inside the stack's processes (``make profile``).

    python -m loadtests.profile [--seconds 30] [--users 64]
    python -m loadtests.profile --render loadtests/results/profiles/DATE.json

Samples are shares, /proc gives the amounts (py-spy counts a thread waiting for a core as active);
Python frames only: an extension's time is counted at the Python line that called it (``_RULES``).
``PROFILE_SECONDS`` sets the length; a run shorter than FULL_SECONDS (the test's) is not recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections import Counter
from contextlib import nullcontext
from pathlib import Path

from loadtests import cpu, loadgen
from loadtests.bench import commit, record_meta, write
from loadtests.points import MIDDLE, OUT, bodies
from testkit.processes import BIN, ROOT, Server, adopt_orphans, bentoml_serve

RECORDED = ROOT / "loadtests" / "results" / "profiles"
PROFILE_MD = ROOT / "loadtests" / "results" / "profile.md"
FULL_SECONDS = 30
PROCESSES = ("tokenizer", "onnx_runner")

ASYNC = "asyncio and threads (futures, locks, queues, hand-offs)"

# A sample whose leaf is the loop's own entry point is time in uvloop's C code (the sockets'
# reads and writes, the callbacks' scheduling): no Python frame of its own to name it by.
LOOP = "event loop (uvloop's C: sockets, callbacks)"
_LOOP_LEAVES = ("run_forever", "run_until_complete", "Runner.run", "run")
_LOOP_FILES = re.compile(r"(^|/)asyncio/(runners|base_events)\.py$")
# (pattern on a frame's file, its function or any, category): the first match from the leaf wins.
# First the Python lines that call into an extension: the sample is the extension's work.
_RULES: tuple[tuple[str, str | None, str], ...] = (
    (r"serving/features\.py$", "tokenize", "tokenizing (tokenizers, Rust)"),
    (r"serving/features\.py$", "pad", "padding (NumPy)"),
    (r"serving/replies\.py$", "dumps", "JSON"),  # orjson, in C
    # a lane thread between calls: SimpleQueue's get, call_soon_threadsafe (both in C)
    (r"serving/batching/batcher\.py$", "_serve", ASYNC),
    (r"onnxruntime/", None, "engine (ONNX Runtime)"),
    (r"(^|/)tokenizers/|sentencepiece", None, "tokenizing (tokenizers, Rust)"),
    (r"(^|/)json/|orjson|msgspec", None, "JSON"),
    (r"(^|/)numpy/", None, "NumPy"),
    (r"(^|/)(pydantic|pydantic_core)/", None, "validation (pydantic)"),
    (r"prometheus_client/", None, "metrics (prometheus_client)"),
    (r"uvicorn/|httptools|h11/", None, "HTTP (uvicorn)"),
    (
        r"aiohttp/|httpx/|httpcore/|services/tokenizer/hop\.py",
        None,
        "HTTP client (the hop to the runner)",
    ),
    (r"starlette/|_?bentoml(_impl|_sdk)?/|opentelemetry/", None, "ASGI app, BentoML's machinery"),
    (r"asyncio/|uvloop/|anyio/|(^|/)selectors\.py|threading\.py", None, ASYNC),
    (r"serving/(hot_path|replies)\.py", None, "the lean route (serving/hot_path.py, replies.py)"),
    (r"serving/batching/", None, "batching (serving/batching)"),
    (r"(^|/)(serving|services|runners)/", None, "this project's other code"),
)
OTHER = "other"

_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def categorize(stack: list[str]) -> str:
    """The category of one sample: ``stack`` is py-spy's frames, root first ("function (file:line)")."""
    frames = [m.groupdict() for f in reversed(stack) if (m := _FRAME.match(f.strip()))]
    leaf = frames[0] if frames else None
    if leaf and leaf["function"] in _LOOP_LEAVES and _LOOP_FILES.search(leaf["file"]):
        return LOOP
    for frame in frames:
        for pattern, function, category in _RULES:
            if re.search(pattern, frame["file"]) and function in (None, frame["function"]):
                return category
    return OTHER


def parse(raw: str, pid: int) -> dict[str, Counter[str]]:
    """py-spy's raw output (``--threads``: each stack starts with "thread (TID): NAME") into sample
    counts by category, for the main thread (TID == PID) and the other threads apart."""
    out: dict[str, Counter[str]] = {"main": Counter(), "other_threads": Counter()}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = re.match(r"thread \((0x[0-9a-fA-F]+|\d+)\)", frames[0])
        tid = int(thread.group(1), 0) if thread else -1
        kind = "main" if tid == pid else "other_threads"
        out[kind][categorize(frames[1:] if thread else frames)] += int(count)
    return out


def split(
    proc_ms: dict[str, float], samples: dict[str, Counter[str]]
) -> dict[str, dict[str, float]]:
    """A process's CPU ms per request from /proc, main thread and other threads apart, split by
    category in the proportions of the samples (the samples give the shares, /proc the amounts)."""
    out: dict[str, dict[str, float]] = {}
    for kind, by in samples.items():
        total = sum(by.values())
        ms = proc_ms[f"{kind}_ms"]
        out[kind] = {c: round(ms * n / total, 4) for c, n in by.most_common()} if total else {}
    return out


def sample(pid: int, seconds: float, rate: int, into: Path) -> subprocess.Popen:
    """py-spy on ``pid``, not pausing it (``--nonblocking``), each thread's stacks apart."""
    argv = [str(BIN / "py-spy"), "record", "--pid", str(pid), "--rate", str(rate)]
    argv += ["--duration", f"{seconds:.0f}", "--format", "raw", "--threads", "--nonblocking"]
    argv += ["--output", str(into)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def profile(server: Server, users: int, seconds: float, rate: int = 250) -> dict:
    found = {name: cpu.workers(server, name) for name in PROCESSES}  # one each by default
    if wrong := {name: len(procs) for name, procs in found.items() if len(procs) != 1}:
        raise RuntimeError(f"workers found, not one of each: {wrong}")
    pids = {name: procs[0].pid for name, procs in found.items()}
    body = bodies("chat", "")
    loadgen.run(server.url, "/embed", body, users, 3)  # warm: the batcher's plans, the caches
    # py-spy's raw stacks are kept beside the figures (flamegraph.pl reads them as they are)
    stacks = OUT / "profile"
    stacks.mkdir(parents=True, exist_ok=True)
    files = {name: stacks / f"{name}.txt" for name in pids}
    before = cpu.snapshot(server)
    samplers: dict[str, subprocess.Popen] = {}
    try:
        for name, pid in pids.items():
            samplers[name] = sample(pid, seconds, rate, files[name])
        load = loadgen.run(server.url, "/embed", body, users, seconds)
        after = cpu.snapshot(server)
        for name, proc in samplers.items():
            said, _ = proc.communicate(timeout=seconds + 60)
            if proc.returncode or not files[name].exists():
                raise RuntimeError(f"py-spy on {name} failed ({proc.returncode}): {said[-600:]}")
    finally:  # a failed load or sampler leaves no py-spy running
        for proc in samplers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    counts = {name: parse(files[name].read_text(), pid) for name, pid in pids.items()}
    proc_cpu = cpu.per_request(before, after, load.ok)
    if missing := [n for n in pids if n not in proc_cpu]:
        raise RuntimeError(
            f"no CPU measured for {missing}: no request answered, or a worker restarted"
        )
    if not all(counts[n]["main"] for n in pids):
        raise RuntimeError("no sample of a main thread: py-spy's thread ids were not the PIDs")
    processes = {name: {"from_proc": proc_cpu[name], **split(proc_cpu[name], kinds),
                        "samples": {kind: sum(by.values()) for kind, by in kinds.items()}}
                 for name, kinds in counts.items()}  # fmt: skip
    return {
        "users": users, "seconds": seconds, "rate_hz": rate, "requests": load.ok,
        "failed": load.failed + load.shed, "requests_per_s": round(load.ok / load.seconds, 1),
        "processes": processes,
    }  # fmt: skip


def markdown(data: dict) -> str:
    meta, run = data["meta"], data["profile"]
    lines = [
        f"Chat (one sentence a request), {run['users']} connections, {run['seconds']:.0f} s, "
        f"{run['requests_per_s']:.0f} requests/s answered, {run['failed']} failed or shed; py-spy "
        f"at {run['rate_hz']} Hz on each worker. CPU ms per request from /proc, main thread (the "
        "event loop) and other threads (the engine's lanes) apart, split by what the sampled "
        "stacks were doing:",
        "",
        "| process | thread | what | ms per request | share of the thread's samples |",
        "|---|---|---|---:|---:|",
    ]
    for name, p in run["processes"].items():
        for kind in ("main", "other_threads"):
            total = p["from_proc"][f"{kind}_ms"]
            row = f"| {name} | {kind.replace('_', ' ')} |"
            for category, ms in p[kind].items():
                if ms >= 0.0005:
                    lines.append(f"{row} {category} | {ms:.3f} | {ms / total:.0%} |")
            lines.append(f"{row} **all** ({p['samples'][kind]:,} samples) | **{total:.3f}** | |")
    lines += ["", f"Measured {meta['date'][:10]}, {meta['machine']}, commit {meta['commit']}."]
    return "\n".join(lines)


def render(recorded: Path) -> Path:
    """loadtests/results/profile.md as the record ``recorded`` gives it."""
    recorded = recorded.resolve()
    data = json.loads(recorded.read_text())
    PROFILE_MD.write_text(
        f"<!-- generated by `make profile` (python -m loadtests.profile --render "
        f"{recorded.relative_to(ROOT)}); do not edit -->\n# Where a chat request's CPU goes\n\n"
        f"{markdown(data)}\n"
    )
    return PROFILE_MD


def main(argv: list[str] | None = None, server: Server | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds", type=float, default=float(os.environ.get("PROFILE_SECONDS", FULL_SECONDS))
    )
    parser.add_argument("--users", type=int, default=MIDDLE)
    parser.add_argument("--out", type=Path, default=OUT / "profile.json")
    parser.add_argument("--render", type=Path, help="regenerate profile.md from a recorded run")
    args = parser.parse_args(argv)
    if args.render:
        print(f"written: {render(args.render)}")
        return 0
    measured = commit()  # the code the server starts with, not what the tree holds at the end
    adopt_orphans()
    print(f"profile: the stack, chat, {args.users} connections, {args.seconds:.0f} s", flush=True)
    with nullcontext(server) if server else bentoml_serve(".", OUT / "logs" / "profile.log") as up:
        run = profile(up, args.users, args.seconds)
    data = {"meta": record_meta(measured), "profile": run}
    written = [write(args.out, data)]
    print(markdown(data))
    if "+" in measured:
        print(f"not recorded: the tree has uncommitted changes ({measured})")
    elif args.seconds >= FULL_SECONDS and not run["failed"]:
        recorded = write(RECORDED / f"{data['meta']['date'][:10]}.json", data)
        written += [recorded, render(recorded)]
    print("\nwritten: " + ", ".join(str(p) for p in written))
    return 1 if run["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
