"""Two commits of the whole graph side by side (``make ab BASE=<rev>``): what one change did.

The base is served from a git worktree under build/ab (removed after), the head is this checkout as
it is; both at once, with this checkout's venv, their points interleaved and the order reversed
every other round. What it prints: loadtests/README.md, "make ab". Not recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shlex
import statistics
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from loadtests import loadgen, points
from testkit.processes import BIN, ROOT, Server, adopt_orphans, free_port, own_home

OUT = ROOT / "build" / "ab"
HEAD = "this checkout"


@dataclass(frozen=True)
class Sample:
    sentences_per_s: float
    p50_ms: float
    tokenizer_ms: float  # the tokenizer process's CPU per request, every thread
    runner_main_ms: float  # the ONNX runner's main thread: its event loop
    # the ONNX runner's CPU outside and inside its engine calls; NaN where it does not count them
    runner_serving_ms: float
    engine_ms: float
    not_ok: int  # requests failed or shed: a change that sheds is a result, not a crash


def sample(point: points.Point) -> Sample:
    tokenizer = point.cpu_ms_per_request.get("tokenizer", {})
    runner = point.cpu_ms_per_request.get("onnx_runner", {})
    return Sample(
        point.sentences_per_s, point.p50_ms, tokenizer.get("total_ms", 0.0),
        runner.get("main_ms", 0.0), runner.get("serving_ms", math.nan),
        runner.get("engine_ms", math.nan), point.failures + point.shed,
    )  # fmt: skip


def summary(base: list[Sample], head: list[Sample]) -> list[tuple[str, float, float, float]]:
    """(figure, base, head, head/base) for every field of Sample: medians over the rounds, but
    ``not_ok`` summed, so a point that shed in one round of several still shows."""
    rows = []
    for name in Sample.__dataclass_fields__:
        over = sum if name == "not_ok" else statistics.median
        b = over(getattr(s, name) for s in base)
        h = over(getattr(s, name) for s in head)
        rows.append((name, b, h, h / b if b else float("nan")))
    return rows


def drained(servers: dict[str, Server]) -> None:
    """Before a point, every server has worked off its backlog (``points.drain``); raise, naming
    it, for one that has not (stuck or gone): its points would measure that, not the change."""
    for name, server in servers.items():
        if not points.drain(server.url):
            raise RuntimeError(f"{name} did not work off its queue (or stopped):\n{server.tail()}")


def serve(tree: Path, name: str, env: dict[str, str] | None = None) -> Server:
    port = free_port()
    # `cd` then exec: the tree's own code is imported first (bentoml puts its working directory
    # at the head of sys.path), and the PID stays bentoml's, to be stopped with its descendants.
    bentoml, at = shlex.quote(str(BIN / "bentoml")), shlex.quote(str(tree))
    command = f"cd {at} && exec {bentoml} serve . --host 127.0.0.1 --port {port}"
    log = OUT / f"{name}.log"
    return Server(["bash", "-c", command], port, log, {**own_home(log), **(env or {})})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the commit to compare this checkout with (any git rev)")
    parser.add_argument("--users", default="1,64", help="wrk connections, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument(
        "--workloads", default="chat", help=f"comma-separated, of {', '.join(points.WORKLOADS)}"
    )
    parser.add_argument("--base-env", default="", help="KEY=VALUE,... for the base's server")
    args = parser.parse_args(argv)
    base_env = dict(kv.split("=", 1) for kv in args.base_env.split(",") if kv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    users = list(dict.fromkeys(int(u) for u in args.users.split(",")))  # each count once
    workloads = list(dict.fromkeys(args.workloads.split(",")))
    if unknown := set(workloads) - set(points.WORKLOADS):
        parser.error(f"unknown workloads {sorted(unknown)}: choose from {list(points.WORKLOADS)}")
    rev = subprocess.run(
        ["git", "rev-parse", "--short", args.base], cwd=ROOT, check=True, capture_output=True,
        text=True,
    ).stdout.strip()  # fmt: skip
    tree = OUT / f"tree-{rev}"
    adopt_orphans()  # a BentoML worker whose arbiter died stays this process's, stopped by PID
    remove = ["git", "worktree", "remove", "--force", str(tree)]
    with contextlib.ExitStack() as stack:  # unwound in reverse: servers stopped, then the tree
        subprocess.run(remove, cwd=ROOT, capture_output=True)
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, check=True)
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT, check=True)
        stack.callback(subprocess.run, remove, cwd=ROOT)
        bodies = {w: points.bodies(w) for w in workloads}
        servers = {rev: serve(tree, "base", base_env), HEAD: serve(ROOT, "head")}
        for server in servers.values():
            stack.callback(server.stop)  # each stopped even if stopping another raised
            server.start()
            for w in workloads:  # warm: sessions, caches, pools
                loadgen.run(server.url, "/embed", bodies[w], 16, 5)
        cases = [(w, u) for w in workloads for u in users]
        samples: dict[tuple[str, str, int], list[Sample]] = defaultdict(list)
        for round_ in range(args.rounds):
            order = list(servers.items())[:: 1 if round_ % 2 == 0 else -1]
            for w, u in cases:
                seconds = args.seconds * (points.BULK_LONGER if w == "bulk" else 1)
                for name, server in order:
                    if w == "bulk":
                        # Admission predicts a wait from the engine speed it measured last: after
                        # chat's small calls, bulk requests were shed as late. Rarer when warmed.
                        loadgen.run(server.url, "/embed", bodies[w], 16, 5)
                    drained(servers)  # no backlog left to take the cores
                    s = sample(points.point(server, name, w, u, seconds))
                    samples[(name, w, u)].append(s)
                    print(
                        f"[{round_ + 1}/{args.rounds}] {name:>13} {w} {u:>3} users: "
                        f"{s.sentences_per_s:6.1f}/s p50 {s.p50_ms:7.2f} ms, CPU ms a request: "
                        f"tokenizer {s.tokenizer_ms:.3f}, runner main {s.runner_main_ms:.3f}, "
                        f"outside the engine {s.runner_serving_ms:.3f}, engine {s.engine_ms:.3f}; "
                        f"failed or shed {s.not_ok}",
                        flush=True,
                    )
    for w, u in cases:
        print(
            f"\n{w}, {u} users, medians of {args.rounds} rounds (not_ok: their sum): "
            f"base {rev}, head {HEAD}"
        )
        print(f"{'figure':<16} {'base':>9} {'head':>9} {'head/base':>9}")
        for name, b, h, ratio in summary(samples[(rev, w, u)], samples[(HEAD, w, u)]):
            print(f"{name:<16} {b:9.3f} {h:9.3f} {ratio:9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
