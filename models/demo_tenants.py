"""Demo tenants' specifications, drawn deterministically from the intent templates the repo ships.

Data only: ``python -m tools.tenants demo`` (``make tenants``) trains and publishes them; tests and
load runs use the same specs to know what each tenant should answer. Tenant i draws 6-12 intents
and, per intent, 8 of its 12 phrasings (templates) for training, each filled 4 times with slot
values; the other 4 templates are kept back. Every fourth tenant is a
TensorFlow model, the rest ONNX; embedding sizes cycle through 128-576 (models of 1-5 MB).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from models import corpus

DIMS = (128, 256, 384, 576)
TRAIN_TEMPLATES = 8


@dataclass(frozen=True)
class DemoTenant:
    index: int
    name: str
    fmt: str
    dim: int
    train: list[tuple[str, str]]  # (text, intent)
    # new fills of the training templates, never seen verbatim
    heldout_phrases: list[tuple[str, str]]
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
