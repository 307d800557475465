"""A soak: every endpoint, mixed, at ~70 % of capacity for a long time; memory and descriptors watched.

    python -m loadtests.soak [--seconds 600] [--interval 30] [--json build/soak.json]   (make soak)

What it sends and how it passes or fails: loadtests/README.md, "make chaos and make soak".
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from loadtests import cpu
from loadtests.openloop import Driver, Outcome, Request, failures
from models import corpus, demo_tenants
from runners.tenants.store import TenantStore
from testkit.processes import ROOT, Server, bentoml_serve

GROWTH_LIMIT = 0.10
# Non-socket descriptors that may come and go, and sockets more at rest: a leak per request passes
# either at once; one per registry write shows only in `make soak`'s full length.
FD_SLACK = 2
SOCKET_SLACK = 1
KEEPALIVE_S = 5.0  # uvicorn's default keep-alive timeout, which BentoML passes to its workers
REST_TIMEOUT_S = 60.0
TENANT, SCRATCH = "soak-tenant", "soak-scratch"
LOAD_SHARE = 0.7
# Connections the client keeps: bounded, so that a burst of arrivals does not open hundreds.
CONNECTIONS = 32
WRITE_EVERY_S = 10.0  # train, upload, delete the scratch tenant in turn


class Mix:
    """Every public endpoint, mixed, each backend: what a soak request is drawn from."""

    def __init__(self) -> None:
        self.texts = corpus.load_texts()
        self.tenant_texts = [t for t, _ in demo_tenants.tenant(1).heldout_phrases]

    def request(self, rng: random.Random) -> Request:
        texts = rng.sample(self.texts, rng.randint(1, 4))
        kind = rng.randrange(9)
        if kind < 3:
            return "/embed", {"texts": texts, "backend": ("onnx", "onnx-int8", "tf")[kind]}
        if kind == 3:
            return "/similarity", {"pairs": [texts[:1] * 2, [texts[0], texts[-1]]]}
        if kind == 4:
            tokenizer = rng.choice(["model", "sentencepiece"])
            return "/tokenize", {"texts": texts, "tokenizer": tokenizer}
        if kind == 5:
            return "/inference", {"input_text": texts[0]}
        if kind == 6:
            return "/classify", {"tenant": TENANT, "texts": rng.sample(self.tenant_texts, 2)}
        if kind == 7:
            return "/tenants/show", {"tenant": TENANT}
        return "/tenants/list", {}


async def train_tenant(driver: Driver) -> None:
    examples = [{"text": t, "intent": i} for t, i in demo_tenants.tenant(1).train]
    resp = await driver.client.post(
        "/tenants/train", json={"tenant": TENANT, "examples": examples}, timeout=300
    )
    resp.raise_for_status()


async def registry_write(
    driver: Driver, step: str, archive: Path | None, into: list[Outcome]
) -> None:
    """One write on the scratch tenant: train, upload (only when there is an archive), delete."""
    if step == "train":
        # every 8th example: the training set is grouped by intent, so this spans all of them
        examples = [{"text": t, "intent": i} for t, i in demo_tenants.tenant(2).train[::8]]
        body = {"tenant": SCRATCH, "examples": examples}
        await driver.one(into, ("/tenants/train", body), timeout_s=300)
    elif step == "upload" and archive is not None:
        files = {"file": ("m.tar.gz", archive.read_bytes())}
        await driver.one(into, ("/tenants/upload", {"tenant": SCRATCH}), files=files, timeout_s=120)
    elif step == "delete":
        await driver.one(into, ("/tenants/delete", {"tenant": SCRATCH}))


async def registry_writes(
    driver: Driver, archive: Path | None, stop: asyncio.Event, into: list[Outcome], every_s: float
) -> None:
    """``registry_write`` in turn every ``every_s`` until ``stop``; one under way is finished."""
    for step in itertools.cycle(("train", "upload", "delete")):
        try:
            await asyncio.wait_for(stop.wait(), every_s)
            return
        except TimeoutError:
            await registry_write(driver, step, archive, into)


def processes(server: Server | None) -> list[psutil.Process]:
    if server is None or server.proc is None:
        return []
    return [server.process(), *server.descendants()]


def descriptors(pid: int) -> tuple[int, int]:
    """(sockets, every other open descriptor) of a process, from /proc."""
    sockets = other = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed while we looked
            continue
        if target.startswith("socket:"):
            sockets += 1
        else:
            other += 1
    return sockets, other


def sample(procs: list[psutil.Process]) -> dict[str, dict]:
    """Per process: resident MB, descriptors other than sockets (``fds``), sockets."""
    out = {}
    for proc in procs:
        try:
            with proc.oneshot():
                sockets, other = descriptors(proc.pid)
                rss_mb = round(proc.memory_info().rss / 2**20, 1)
                key = f"{proc.pid} {cpu.label(proc)}"
                out[key] = {"rss_mb": rss_mb, "fds": other, "sockets": sockets}
        except (psutil.NoSuchProcess, FileNotFoundError):
            continue
    return out


async def at_rest(
    server: Server, wait_s: float = KEEPALIVE_S + 1, timeout_s: float = REST_TIMEOUT_S
) -> tuple[dict[str, int], bool]:
    """Each process's sockets after ``wait_s`` (the keep-alive timeout): the first count that holds
    for 2 s, and True; after ``timeout_s`` more without one, the last count and False."""
    await asyncio.sleep(wait_s)
    deadline = time.monotonic() + timeout_s
    last: dict[str, int] = {}
    while True:
        now = {k: v["sockets"] for k, v in sample(processes(server)).items()}
        if last and now == last:
            return now, True
        last = now
        if time.monotonic() >= deadline:
            return last, False
        await asyncio.sleep(2)


def socket_growth(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Sockets more at rest after the soak than before, per process, past SOCKET_SLACK; a process
    that appeared or vanished is unbounded (a crash or a restart)."""
    result = {}
    for key in sorted(before.keys() | after.keys()):
        if key not in before or key not in after:
            result[key] = float("inf")
        else:
            result[key] = float(max(0, after[key] - before[key] - SOCKET_SLACK))
    return result


def growth(samples: list[dict], warmup_s: float) -> dict[str, dict[str, float]]:
    """Per process, each figure's growth after warm-up: the median of the last third of the samples
    against that of the first third (a leak shows; a figure that swings with the load does not). A
    process that appears or vanishes after warm-up is unbounded growth (a crash or a restart)."""
    after = [s["processes"] for s in samples if s["t"] >= warmup_s]
    if len(after) < 2:
        return {}
    third = max(1, len(after) // 3)
    first, last = after[:third], after[-third:]
    result = {}
    for key in sorted({k for s in after for k in s}):
        if any(key not in s for s in after):
            result[key] = {"rss_mb": float("inf"), "fds": float("inf")}
            continue
        result[key] = {}
        for figure in ("rss_mb", "fds"):
            before = statistics.median(s[key][figure] for s in first)
            after_ = statistics.median(s[key][figure] for s in last)
            slack = FD_SLACK if figure == "fds" else 0
            result[key][figure] = round(max(0.0, after_ - before - slack) / before, 4)
    return result


async def run(
    url: str,
    server: Server | None,
    seconds: float,
    interval: float,
    store: Path | None = None,
    write_every_s: float = WRITE_EVERY_S,
) -> dict:
    """``store``: the server's tenant store, when it is ours (the upload sends an archive from it)."""
    mix = Mix()
    async with Driver(url, mix.request, connections=CONNECTIONS, seed=5) as driver:
        await train_tenant(driver)
        archive = None
        if store is not None:
            archive = TenantStore(store).archive(TENANT, Path(tempfile.mkdtemp()) / "soak.tar.gz")
        before: list[Outcome] = []  # the capacity run and the first writes
        capacity = await driver.closed(8, min(10.0, seconds / 4), before)
        rest_before: dict[str, Any] = {}
        settled_before = True
        if server is not None:
            for step in ("train", "upload", "delete"):
                await registry_write(driver, step, archive, before)
            rest_before, settled_before = await at_rest(server)
        per_s = LOAD_SHARE * capacity
        print(
            f"capacity {capacity:.1f} requests/s of the mix; soak at {per_s:.1f}/s for {seconds:.0f} s",
            flush=True,
        )
        samples: list[dict] = []
        started = time.monotonic()

        def take() -> dict:
            t = round(time.monotonic() - started, 1)
            samples.append({"t": t, "processes": sample(processes(server))})
            return samples[-1]

        async def watch() -> None:
            while True:
                print(f"  t={take()['t']:>5.0f} s  {samples[-1]['processes']}", flush=True)
                await asyncio.sleep(interval)

        outcomes: list[Outcome] = []
        watcher = asyncio.create_task(watch())
        # A registry write every WRITE_EVERY_S: the first, a training, comes before the baseline.
        stop = asyncio.Event()
        writer = asyncio.create_task(
            registry_writes(driver, archive, stop, outcomes, write_every_s)
        )
        await driver.open(per_s, seconds, outcomes)
        watcher.cancel()
        stop.set()
        await writer
        take()
        warmup_s = max(interval, seconds / 5)
        grown = growth(samples, warmup_s)
        worst = max((v for g in grown.values() for v in g.values()), default=0.0)
        rest_after: dict[str, Any] = {}
        settled_after = True
        if server is not None:
            rest_after, settled_after = await at_rest(server)
        sockets_grown = socket_growth(rest_before, rest_after)
        failed, failed_before = failures(outcomes), failures(before)
        settled = settled_before and settled_after
        bounded = bool(grown) and worst <= GROWTH_LIMIT and not any(sockets_grown.values())
        return {
            "seconds": seconds,
            "interval_s": interval,
            "warmup_s": warmup_s,
            "capacity_per_s": round(capacity, 2),
            "offered_per_s": round(per_s, 2),
            "requests": len(outcomes),
            "statuses": dict(sorted(Counter(str(o.status) for o in outcomes).items())),
            "by_path": dict(sorted(Counter(o.path for o in outcomes).items())),
            "failures": dict(failed.most_common()),
            "capacity_failures": dict(failed_before.most_common()),
            "samples": samples,
            "growth_after_warmup": grown,
            "worst_growth": worst,
            "sockets_at_rest": {"before": rest_before, "after": rest_after, "settled": settled},
            "sockets_grown_at_rest": sockets_grown,
            # With --url the processes are not ours to sample: only the requests decide then.
            "passed": not failed
            and not failed_before
            and (server is None or (bounded and bool(rest_before) and settled)),
        }


def render(report: dict) -> str:
    lines = [
        f"soak: {report['requests']} requests in {report['seconds']:.0f} s at {report['offered_per_s']}/s "
        f"(70 % of {report['capacity_per_s']}/s); statuses {report['statuses']}",
        "| process | resident MB (first → last) | fds, not sockets (first → last) | "
        "sockets under load (first → last) | sockets at rest (before → after) | growth after warm-up |",
        "|---|---:|---:|---:|---:|---|",
    ]
    first, last = report["samples"][0]["processes"], report["samples"][-1]["processes"]
    rest = report["sockets_at_rest"]
    if not rest["before"]:
        at_rest_line = "sockets at rest not counted (not our processes)"
    elif not rest["settled"]:
        at_rest_line = "sockets at rest did not settle"
    else:
        more = max(report["sockets_grown_at_rest"].values(), default=0)
        at_rest_line = f"sockets more at rest {more:.0f} (past a slack of {SOCKET_SLACK})"
    for key, grown in report["growth_after_warmup"].items():
        a, b = first.get(key, {}), last.get(key, {})
        lines.append(
            f"| {key} | {a.get('rss_mb')} → {b.get('rss_mb')} | {a.get('fds')} → {b.get('fds')} | "
            f"{a.get('sockets')} → {b.get('sockets')} | "
            f"{rest['before'].get(key)} → {rest['after'].get(key)} | "
            + ", ".join(f"{k} {v:+.1%}" for k, v in grown.items())
            + " |"
        )
    if report["failures"]:
        lines.append(f"failed requests: {report['failures']}")
    lines.append(
        f"{'PASSED' if report['passed'] else 'FAILED'}: worst growth after warm-up "
        f"{report['worst_growth']:+.1%} (limit +{GROWTH_LIMIT:.0%}); {at_rest_line}; "
        f"{len(report['failures'])} kinds of failure"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.soak", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seconds", type=float, default=600, help="length of the soak")
    parser.add_argument("--interval", type=float, default=30, help="seconds between samples")
    parser.add_argument("--url", help="an already running stack (its processes are not sampled)")
    parser.add_argument("--json", type=Path, default=ROOT / "build" / "soak.json")
    args = parser.parse_args(argv)
    if args.url:
        report = asyncio.run(run(args.url, None, args.seconds, args.interval))
    else:
        with tempfile.TemporaryDirectory() as store:
            env = {"BUNDLE_TENANTS_STORE": store}
            with bentoml_serve(".", ROOT / "build" / "soak" / "stack.log", env=env) as server:
                report = asyncio.run(
                    run(server.url, server, args.seconds, args.interval, Path(store))
                )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print(render(report))
    print(f"\nwritten: {args.json}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
