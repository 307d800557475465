"""Several models on one runner: does one model saturated with bulk requests starve another?

A catalogue of two models — the default catalogue's first embed model (A) and the same weights
under a second name (B), each with its own queues and batches — is built and served as `make serve`
serves it. B's one-sentence requests are timed from one client alone, then again while A is
saturated with bulk requests; the figure is B's p99 in both, side by side.
"""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from loadtests import loadgen
from testkit.processes import ROOT, Servers, bentoml_serve

# B: A's weights under another name, on fp32 ONNX only.
SECOND = "isolation-b"
# A's bulk load: enough clients to keep its queues full (it sheds some requests: saturated).
SATURATING_USERS = 64


def two_models(out: Path) -> tuple[Path, str]:
    """The catalogue of A and B, written to ``out``: its path, and A's name."""
    from serving import catalogue

    first = catalogue.current().default("embed")
    if first is None:
        raise SystemExit(f"error: {catalogue.path()} has no embed model")
    second = first.model_copy(
        update={"name": SECOND, "backends": ("onnx",), "dimensions": None, "aliases": ()}
    )
    source = first.source
    if not source.startswith("package:") and not Path(source).is_absolute():
        local = catalogue.path().parent / source
        source = str(local.resolve()) if local.exists() else source  # else a hub id
    entries = [{**m.model_dump(exclude_none=True), "source": source}
               for m in (first.model_copy(update={"backends": ("onnx",)}), second)]  # fmt: skip
    path = out / "two-models.yaml"
    path.write_text(yaml.safe_dump({"models": entries}, sort_keys=False))
    return path, first.name


def measure(out: Path, seconds: float) -> dict:
    """B's one-sentence latency alone and beside A's bulk saturation, on one graph."""
    path, first = two_models(out)
    # B into the model store (built once, reused after); A is the default catalogue's, already
    # built by `make models`.
    argv = [sys.executable, "-m", "models.build", "--catalogue", str(path), "--only", SECOND]
    subprocess.run(argv, cwd=ROOT, check=True)
    b_bodies = loadgen.write_bodies("chat", out / "bodies" / "isolation-b.jsonl", model=SECOND)
    a_bodies = loadgen.write_bodies("bulk", out / "bodies" / "isolation-a.jsonl", model=first)
    env = {"BUNDLE_CATALOGUE": str(path)}
    with Servers({"two models": bentoml_serve(".", out / "logs" / "two-models.log", env)}) as up:
        url = up["two models"].url
        loadgen.run(url, "/embed", b_bodies, 1, 2)  # warm-up
        alone = loadgen.run(url, "/embed", b_bodies, 1, seconds)
        # A starts first and ends last: B is measured only while A is saturated.
        with ThreadPoolExecutor(1) as pool:
            saturating = pool.submit(
                loadgen.run, url, "/embed", a_bodies, SATURATING_USERS, seconds + 6
            )
            time.sleep(3)
            beside = loadgen.run(url, "/embed", b_bodies, 1, seconds)
        a = saturating.result()
    return {
        "model_a": first, "model_b": SECOND,
        "b_alone_p50_ms": alone.p50_ms, "b_alone_p99_ms": alone.p99_ms,
        "b_beside_a_p50_ms": beside.p50_ms, "b_beside_a_p99_ms": beside.p99_ms,
        "b_p99_ratio": round(beside.p99_ms / alone.p99_ms, 2),
        "b_failed": alone.failed + beside.failed + alone.shed + beside.shed,
        "a_sentences_per_s": round(a.ok * loadgen.BULK / a.seconds, 1), "a_shed": a.shed,
        "seconds": seconds,
    }  # fmt: skip
