"""Demo tenants, built deterministically from the intent templates the repo ships (``make tenants``).

Tenant i draws 6-12 intents and, per intent, 8 of its 12 phrasings (templates) for training, each
filled 4 times with slot values; the other 4 templates are kept back. Every fourth tenant is a
TensorFlow model, the rest ONNX; embedding sizes cycle through 128-576 (models of 1-5 MB).
"""

from __future__ import annotations

import multiprocessing
import random
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models import corpus
from runners.tenants import registry
from runners.tenants.store import TenantStore, read_manifest

DIMS = (128, 256, 384, 576)
TRAIN_TEMPLATES = 8


@dataclass(frozen=True)
class DemoTenant:
    index: int
    name: str
    fmt: str
    dim: int
    train: list[tuple[str, str]]  # (text, intent)
    heldout_phrases: list[
        tuple[str, str]
    ]  # new fills of the training templates, never seen verbatim
    unseen_templates: list[tuple[str, str]]  # fills of the templates kept back


def tenant(index: int) -> DemoTenant:
    rng = random.Random(index)
    templates = corpus.intent_templates().intents
    intents = sorted(rng.sample(sorted(templates), rng.randint(6, 12)))
    train, candidates, unseen = [], [], []
    for intent in intents:
        phrasings = templates[intent][:]
        rng.shuffle(phrasings)
        chosen, kept_back = phrasings[:TRAIN_TEMPLATES], phrasings[TRAIN_TEMPLATES:]
        train += [(corpus.fill(t, rng), intent) for t in chosen for _ in range(4)]
        candidates += [(corpus.fill(t, rng), intent) for t in chosen for _ in range(2)]
        unseen += [(corpus.fill(t, rng), intent) for t in kept_back for _ in range(3)]
    seen = {text for text, _ in train}
    heldout = [(text, intent) for text, intent in candidates if text not in seen]
    fmt = "tf" if index % 4 == 3 else "onnx"
    return DemoTenant(
        index, f"tenant-{index:04d}", fmt, DIMS[(index // 4) % 4], train, heldout, unseen
    )


def accuracy(predict, examples: list[tuple[str, str]]) -> float:
    if not examples:
        return float("nan")
    predicted = predict([t for t, _ in examples])
    return float(np.mean([p == want for p, (_, want) in zip(predicted, examples, strict=True)]))


def _build_one(root: str, index: int, vocab: int) -> str:
    """Train and publish one demo tenant (runs in a worker process)."""
    from runners.tenants.__main__ import _encoder

    spec = tenant(index)
    encode, _ = _encoder()
    registry.train(
        TenantStore(Path(root)), spec.name, encode([t for t, _ in spec.train]), [i for _, i in spec.train],
        vocab=vocab, fmt=spec.fmt, dim=spec.dim, seed=index, source="demo", extra_metrics={"demo_seed": float(index)},
    )  # fmt: skip
    return spec.name


def build(
    store: TenantStore, count: int, vocab: int, *, jobs: int = 2, force: bool = False, log=print
) -> None:
    """Build tenants 1..count; ones already built from the same seed are kept (unless force)."""
    started = time.perf_counter()
    todo = []
    for index in range(1, count + 1):
        found = store.current(tenant(index).name)
        if force or not found or read_manifest(found[1]).metrics.get("demo_seed") != index:
            todo.append(index)
    log(
        f"{count - len(todo)} of {count} demo tenants already built; building {len(todo)} with {jobs} processes"
    )
    # spawn, not fork: TensorFlow's threads do not survive a fork.
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_build_one, str(store.root), index, vocab) for index in todo]
        for done, future in enumerate(as_completed(futures), 1):
            future.result()
            if done % 25 == 0 or done == len(todo):
                rate = done / (time.perf_counter() - started)
                log(
                    f"[{done}/{len(todo)}] built, {rate:.1f} tenants/s, about {(len(todo) - done) / rate:.0f} s left"
                )
