"""A soak: every endpoint, mixed, at ~70 % of capacity for a long time; memory and descriptors watched.

    python -m loadtests.soak [--seconds 600] [--interval 30] [--json build/soak.json]   (make soak)

What it sends and how it passes or fails: loadtests/README.md, "make chaos and make soak".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

from loadtests import cpu
from loadtests.bench import write
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
CONNECTIONS = 32  # the client's, bounded: a burst of arrivals does not open hundreds
WRITE_EVERY_S = 10.0  # train, upload, delete the scratch tenant in turn


class Mix:
    """Every public endpoint, mixed, each backend: what a soak request is drawn from."""

    def __init__(self) -> None:
        self.texts = corpus.load_texts()
        self.tenant_texts = [t for t, _ in demo_tenants.tenant(1).heldout_phrases]

    def request(self, rng: random.Random) -> Request:
        texts = rng.sample(self.texts, rng.randint(1, 4))
        kinds: list[Request] = [
            *(("/embed", {"texts": texts, "backend": b}) for b in ("onnx", "onnx-int8", "tf")),
            ("/similarity", {"pairs": [texts[:1] * 2, [texts[0], texts[-1]]]}),
            ("/tokenize", {"texts": texts, "tokenizer": rng.choice(["model", "sentencepiece"])}),
            ("/inference", {"input_text": texts[0]}),
            ("/classify", {"tenant": TENANT, "texts": rng.sample(self.tenant_texts, 2)}),
            ("/tenants/show", {"tenant": TENANT}),
            ("/tenants/list", {}),
        ]
        return rng.choice(kinds)


async def registry_write(driver: Driver, step: str, archive: Path, into: list[Outcome]) -> None:
    """One write on the scratch tenant: train, upload, delete."""
    if step == "train":
        # every 8th example: the training set is grouped by intent, so this spans all of them
        examples = [{"text": t, "intent": i} for t, i in demo_tenants.tenant(2).train[::8]]
        body = {"tenant": SCRATCH, "examples": examples}
        await driver.one(into, ("/tenants/train", body), timeout_s=300)
    elif step == "upload":
        files = {"file": ("m.tar.gz", archive.read_bytes())}
        await driver.one(into, ("/tenants/upload", {"tenant": SCRATCH}), files=files, timeout_s=120)
    elif step == "delete":
        await driver.one(into, ("/tenants/delete", {"tenant": SCRATCH}))


async def write_in_turn(
    driver: Driver, archive: Path, stop: asyncio.Event, into: list[Outcome], every_s: float
) -> None:
    """``registry_write`` in turn every ``every_s`` until ``stop``; one under way is finished."""
    for step in itertools.cycle(("train", "upload", "delete")):
        try:
            await asyncio.wait_for(stop.wait(), every_s)
            return
        except TimeoutError:
            await registry_write(driver, step, archive, into)


def descriptors(pid: int) -> tuple[int, int]:
    """(sockets, every other open descriptor) of a process, from /proc."""
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed while we looked
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    sockets = sum(target.startswith("socket:") for target in targets)
    return sockets, len(targets) - sockets


def sample(procs: list[psutil.Process]) -> dict[str, dict]:
    """Per process: resident MB, descriptors other than sockets (``fds``), sockets."""
    out = {}
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, FileNotFoundError), proc.oneshot():
            sockets, other = descriptors(proc.pid)
            rss_mb = round(proc.memory_info().rss / 2**20, 1)
            key = f"{proc.pid} {cpu.label(proc)}"
            out[key] = {"rss_mb": rss_mb, "fds": other, "sockets": sockets}
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
        now = {k: v["sockets"] for k, v in sample(cpu.processes(server)).items()}
        if last and now == last:
            return now, True
        last = now
        if time.monotonic() >= deadline:
            return last, False
        await asyncio.sleep(2)


def socket_growth(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Sockets more at rest after the soak than before, per process, past SOCKET_SLACK; a process
    that appeared or vanished is unbounded (a crash or a restart)."""
    both = before.keys() & after.keys()
    return {
        key: float(max(0, after[key] - before[key] - SOCKET_SLACK)) if key in both else float("inf")
        for key in sorted(before.keys() | after.keys())
    }


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
        for figure, slack in (("rss_mb", 0), ("fds", FD_SLACK)):
            before = statistics.median(s[key][figure] for s in first)
            after_ = statistics.median(s[key][figure] for s in last)
            result[key][figure] = round(max(0.0, after_ - before - slack) / before, 4)
    return result


async def run(
    server: Server,
    seconds: float,
    interval: float,
    store: Path,
    write_every_s: float = WRITE_EVERY_S,
) -> dict:
    """``store``: the server's tenant store (the upload sends an archive from it)."""
    mix = Mix()
    async with Driver(server.url, mix.request, connections=CONNECTIONS, seed=5) as driver:
        examples = [{"text": t, "intent": i} for t, i in demo_tenants.tenant(1).train]
        body = {"tenant": TENANT, "examples": examples}
        (await driver.client.post("/tenants/train", json=body, timeout=300)).raise_for_status()
        archive = TenantStore(store).archive(TENANT, Path(tempfile.mkdtemp()) / "soak.tar.gz")
        before: list[Outcome] = []  # the capacity run and the first writes
        capacity = await driver.closed(8, min(10.0, seconds / 4), before)
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
            samples.append({"t": t, "processes": sample(cpu.processes(server))})
            return samples[-1]

        async def watch() -> None:
            while True:
                print(f"  t={take()['t']:>5.0f} s  {samples[-1]['processes']}", flush=True)
                await asyncio.sleep(interval)

        outcomes: list[Outcome] = []
        watcher = asyncio.create_task(watch())
        # A registry write every WRITE_EVERY_S: the first, a training, comes before the baseline.
        stop = asyncio.Event()
        writer = asyncio.create_task(write_in_turn(driver, archive, stop, outcomes, write_every_s))
        await driver.open(per_s, seconds, outcomes)
        watcher.cancel()
        stop.set()
        await writer
        take()
        warmup_s = max(interval, seconds / 5)
        grown = growth(samples, warmup_s)
        worst = max((v for g in grown.values() for v in g.values()), default=0.0)
        rest_after, settled_after = await at_rest(server)
        sockets_grown = socket_growth(rest_before, rest_after)
        failed, failed_before = failures(outcomes), failures(before)
        settled = settled_before and settled_after
        bounded = bool(grown) and worst <= GROWTH_LIMIT and not any(sockets_grown.values())
        passed = bounded and bool(rest_before) and settled and not failed and not failed_before
        return {
            "seconds": seconds, "interval_s": interval, "warmup_s": warmup_s,
            "capacity_per_s": round(capacity, 2), "offered_per_s": round(per_s, 2),
            "requests": len(outcomes),
            "statuses": dict(sorted(Counter(str(o.status) for o in outcomes).items())),
            "by_path": dict(sorted(Counter(o.path for o in outcomes).items())),
            "failures": dict(failed.most_common()),
            "capacity_failures": dict(failed_before.most_common()),
            "samples": samples, "growth_after_warmup": grown, "worst_growth": worst,
            "sockets_at_rest": {"before": rest_before, "after": rest_after, "settled": settled},
            "sockets_grown_at_rest": sockets_grown, "passed": passed,
        }  # fmt: skip


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
    if not rest["settled"]:
        at_rest_line = "sockets at rest did not settle"
    else:
        more = max(report["sockets_grown_at_rest"].values(), default=0)
        at_rest_line = f"sockets more at rest {more:.0f} (past a slack of {SOCKET_SLACK})"
    for key, grown in report["growth_after_warmup"].items():
        a, b = first.get(key, {}), last.get(key, {})
        cells = [f"{a.get(f)} → {b.get(f)}" for f in ("rss_mb", "fds", "sockets")]
        cells.append(f"{rest['before'].get(key)} → {rest['after'].get(key)}")
        cells.append(", ".join(f"{k} {v:+.1%}" for k, v in grown.items()))
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    if report["failures"]:
        lines.append(f"failed requests: {report['failures']}")
    lines.append(
        f"{'PASSED' if report['passed'] else 'FAILED'}: worst growth after warm-up "
        f"{report['worst_growth']:+.1%} (limit +{GROWTH_LIMIT:.0%}); {at_rest_line}; "
        f"{len(report['failures'])} kinds of failure"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600, help="length of the soak")
    parser.add_argument("--interval", type=float, default=30, help="seconds between samples")
    parser.add_argument("--json", type=Path, default=ROOT / "build" / "soak.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as store:
        env = {"BUNDLE_TENANTS_STORE": store}
        with bentoml_serve(".", ROOT / "build" / "soak" / "stack.log", env=env) as server:
            report = asyncio.run(run(server, args.seconds, args.interval, Path(store)))
    print(render(report))
    print(f"\nwritten: {write(args.json, report)}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
