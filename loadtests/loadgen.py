"""The benchmark's load generator: wrk (C, from Debian's packages) with a Lua script that sends JSON
bodies drawn from the project's corpus and counts every status (why wrk: loadtests/README.md).
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from models import corpus
from testkit.processes import ROOT

SCRIPT = ROOT / "loadtests" / "wrk" / "bodies.lua"
BULK = 32


@dataclass
class Load:
    requests: int  # answered (any status)
    ok: int  # 200
    shed: int  # 429 / 503: refused with Retry-After
    failed: int  # any other status, and socket errors (reset, timeout)
    seconds: float
    p50_ms: float
    p99_ms: float
    statuses: dict[str, int]
    loadgen_cpu_s: float  # the load generator's own CPU time over the run


def write_bodies(
    workload: str, out: Path, backend: str = "", count: int = 2000, model: str = ""
) -> Path:
    """One JSON body per line: chat sends one corpus text per request, bulk 32 (the same texts
    whatever the backend or model)."""
    texts = corpus.load_texts()
    rng = random.Random(7)
    extra = {k: v for k, v in (("backend", backend), ("model", model)) if v}

    def body(i: int) -> str:
        chosen = [texts[i % len(texts)]] if workload == "chat" else rng.sample(texts, BULK)
        return json.dumps({"texts": chosen, **extra})

    lines = [body(i) for i in range(count)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return out


def run(
    url: str, path: str, bodies: Path, connections: int, seconds: float, timeout_s: float = 30
) -> Load:
    """``connections`` closed-loop clients for ``seconds``; statuses, latency and wrk's own CPU."""
    if not (wrk := shutil.which("wrk")):
        raise SystemExit("error: wrk is not installed: `make tools` installs it (Debian package)")
    argv = [wrk, "-t1", f"-c{connections}", f"-d{seconds:.0f}s"]
    argv += [f"--timeout={timeout_s:.0f}s", "-s", str(SCRIPT), url, "--", path, str(bodies)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + timeout_s + 30)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(
            f"wrk failed ({proc.returncode}): {proc.stdout[-800:]}{proc.stderr[-800:]}"
        )
    out = json.loads(lines[-1])
    statuses = {str(k): int(v) for k, v in out["statuses"].items()}
    ok = statuses.get("200", 0)
    shed = statuses.get("429", 0) + statuses.get("503", 0)
    answered = sum(statuses.values())
    return Load(
        requests=answered, ok=ok, shed=shed,
        failed=answered - ok - shed + int(out["socket_errors"]),
        seconds=float(out["seconds"]) or wall,
        p50_ms=float(out["p50_ms"]), p99_ms=float(out["p99_ms"]), statuses=statuses,
        loadgen_cpu_s=(after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
    )  # fmt: skip
