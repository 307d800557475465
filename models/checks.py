"""What every built model is checked against before it is stored, and what ``make parity`` reports:
agreement with its PyTorch reference, the parity gate, and the int8 accuracy gate.

The parity gate is one rule for every backend of every model, on at least 500 inputs:
- an embed model's sentence pairs (600 of the corpus's): the cosine of each pair by the backend
  against PyTorch's, each pair's 0/1 label at a threshold, and the largest |difference|;
- a rerank or classify model's head: its logits against PyTorch's, and each input's decision (the
  argmax; a rerank score's side of 0, the sigmoid's 0.5); a reranker reads sentence pairs (600 of
  the corpus's, each encoded as a pair), a classifier single texts;
- fp32 (onnx, tf): 0 flips and a max |difference| of at most 1e-5; int8: at most 1 % flipped. A
  head's differences are taken relative to its largest logit where that is larger than 1: a logit
  is a sum of terms whose size the head's weights set, and fp32 rounds each term in proportion to
  it, whatever the sum (a logit near 0 is large terms that cancel); a cosine is never over 1.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from models import corpus
from models.source import Source
from serving.catalogue import ModelSpec
from serving.features import Feeds, cosine, load_tokenizer, pad, tokenize, tokenize_pairs

INT8_GATE = {"mean_cosine_min": 0.99, "min_cosine_min": 0.95}
FP32_MAX_DIFF = 1e-5
INT8_MAX_FLIP_RATE = 0.01
PAIRS = 600
# The 0/1 label of a sentence pair: its cosine at this threshold, unless it does not split the
# reference's pairs (fewer than a tenth on a side: a model whose vectors all point one way), where
# a threshold near the reference's median does.
THRESHOLD = 0.5

Run = Callable[[Feeds], np.ndarray]


class BuildError(RuntimeError):
    """A model was built but rejected (a gate); the message says why."""


class Checks:
    """The held-out inputs of one catalogue model, and what is measured on them."""

    def __init__(self, src: Source, spec: ModelSpec) -> None:
        self.src = src
        self.spec = spec
        self.texts = corpus.heldout_sentences()

    @cache  # noqa: B019 - one instance per model
    def tokenizer(self) -> Any:
        return load_tokenizer(self.src.path / "tokenizer.json", self.spec.max_length)

    @cache  # noqa: B019
    def pair_tokenizer(self) -> Any:
        """Pairs cut from their second text (a tokenizer set so cannot cut a single text)."""
        return load_tokenizer(self.src.path / "tokenizer.json", self.spec.max_length, pairs=True)

    def feeds(self, ids: list[list[int]], segments: list[int] | None = None) -> Feeds:
        return pad(ids, self.spec.pad_id, self.spec.token_types, segments)

    def in_batches(self, texts: list[str], ordered: bool = False) -> list[Feeds]:
        """``texts`` tokenized and padded in batches of 32, in their order (mixed lengths, so
        padding must not leak) or ``ordered`` by length."""
        ids = tokenize(self.tokenizer(), texts)
        if ordered:
            ids.sort(key=len)
        return [self.feeds(ids[i : i + 32]) for i in range(0, len(ids), 32)]

    @cache  # noqa: B019
    def batches(self) -> list[Feeds]:
        """The check texts in unsorted batches of 32."""
        return self.in_batches(self.texts)

    @cache  # noqa: B019
    def torch_run(self) -> Run:
        from models import reference

        model = reference.load(self.src.path, self.spec)
        return lambda feeds: reference.run(model, feeds)

    @cache  # noqa: B019
    def reference(self) -> np.ndarray:
        return np.concatenate([self.torch_run()(feeds) for feeds in self.batches()])

    def agreement(self, run: Run) -> dict[str, float]:
        """How an engine's outputs compare with PyTorch's on the check sentences."""
        got = np.concatenate([run(feeds) for feeds in self.batches()])
        ref = self.reference()
        figures = {"sentences": len(ref), "max_abs_diff_vs_torch": float(np.max(np.abs(got - ref)))}
        if self.spec.task == "embed":
            cos = cosine(got, ref)
            figures |= {
                "mean_cosine_vs_torch": float(np.mean(cos)),
                "min_cosine_vs_torch": float(np.min(cos)),
            }
        return figures

    # -- the parity gate ------------------------------------------------------------------------

    @cache  # noqa: B019
    def parity_inputs(self) -> tuple[list[list[int]], list[tuple[int, int]], list[int] | None]:
        """The parity check's token ids, (for an embed model) its pairs as indices into them, and
        (for a reranker, whose inputs are pairs) where each second text starts."""
        pairs = corpus.sentence_pairs(PAIRS)
        if self.spec.task == "embed":
            texts = sorted({t for pair in pairs for t in pair})
            index = {t: i for i, t in enumerate(texts)}
            ids = tokenize(self.tokenizer(), texts)
            return ids, [(index[a], index[b]) for a, b in pairs], None
        if self.spec.task == "rerank":
            ids, segments = tokenize_pairs(self.pair_tokenizer(), pairs)
            return ids, [], segments
        texts = [t for pair in pairs for t in pair][:PAIRS]
        return tokenize(self.tokenizer(), texts), [], None

    def scores(self, run: Run) -> np.ndarray:
        """What the parity gate compares: each pair's cosine (embed), or each input's logits.
        Unsorted batches of 32: every batch mixes lengths, so padding leaking into a row shows."""
        ids, pairs, segments = self.parity_inputs()
        out = np.concatenate(
            [
                run(self.feeds(ids[i : i + 32], None if segments is None else segments[i : i + 32]))
                for i in range(0, len(ids), 32)
            ]
        )
        if self.spec.task != "embed":
            return out
        return cosine(out[[p[0] for p in pairs]], out[[p[1] for p in pairs]])

    @cache  # noqa: B019
    def reference_scores(self) -> np.ndarray:
        return self.scores(self.torch_run())

    def decisions(self, scores: np.ndarray, threshold: float) -> np.ndarray:
        if self.spec.task == "classify":
            return scores.argmax(axis=1)
        if self.spec.task == "rerank":
            return scores[:, 0] >= 0  # sigmoid(logit) >= 0.5
        return scores >= threshold

    def threshold(self) -> float:
        reference = self.reference_scores()
        below = float(np.mean(reference < THRESHOLD))
        if self.spec.task != "embed" or 0.1 <= below <= 0.9:
            return THRESHOLD
        # Not the median itself: the parity pairs repeat some, and a threshold on a repeated
        # score would count its pairs as flipped for any difference at all. The middle of the
        # widest gap between the reference's scores around the median instead.
        lo, hi = np.quantile(reference, [0.4, 0.6])
        middle = np.unique(reference[(reference >= lo) & (reference <= hi)])
        if len(middle) < 2:
            return float(np.median(reference))
        widest = int(np.argmax(np.diff(middle)))
        return float((middle[widest] + middle[widest + 1]) / 2)

    def parity(self, run: Run) -> dict[str, float]:
        """A backend against PyTorch: flips of the 0/1 decision and the |difference|s."""
        reference, got = self.reference_scores(), self.scores(run)
        threshold = self.threshold()
        flips = self.decisions(got, threshold) != self.decisions(reference, threshold)
        diff = np.abs(got - reference)
        if self.spec.task != "embed":  # logits are not bounded as a cosine is
            diff = diff / max(1.0, float(np.abs(reference).max()))
        return {
            "inputs": len(reference),
            "mismatches": int(np.sum(flips)),
            "threshold": threshold,
            "max_diff": float(diff.max()),
            "min_diff": float(diff.min()),
            "mean_diff": float(diff.mean()),
            "std_diff": float(diff.std()),
        }


def parity_failure(backend: str, figures: dict[str, float]) -> str | None:
    """Why a backend's parity figures fail the gate, or None."""
    if backend == "onnx-int8":
        if figures["mismatches"] > INT8_MAX_FLIP_RATE * figures["inputs"]:
            return (
                f"{backend}: {figures['mismatches']:.0f} of {figures['inputs']:.0f} flipped, more "
                f"than {INT8_MAX_FLIP_RATE:.0%}"
            )
        return None
    if figures["mismatches"] or figures["max_diff"] > FP32_MAX_DIFF:
        return (
            f"{backend}: {figures['mismatches']:.0f} flipped, max |difference| "
            f"{figures['max_diff']:.2e} (needs 0 and <= {FP32_MAX_DIFF:g})"
        )
    return None


def int8_gate(checks: Checks, fp32: Run, int8: Run) -> dict[str, float]:
    """int8 against fp32 on the check sentences; raises BuildError below the gate. An embed
    model's vectors by cosine; a head's decisions (parity's flips carry its gate)."""
    if checks.spec.task != "embed":
        return checks.agreement(int8)
    cos = np.concatenate([cosine(fp32(feeds), int8(feeds)) for feeds in checks.batches()])
    figures = {
        "sentences": int(cos.size),
        "mean_cosine_vs_fp32": float(cos.mean()),
        "min_cosine_vs_fp32": float(cos.min()),
    }
    gate = INT8_GATE
    print(
        f"      accuracy gate: mean cosine {figures['mean_cosine_vs_fp32']:.4f} "
        f"(>= {gate['mean_cosine_min']}), min {figures['min_cosine_vs_fp32']:.4f} "
        f"(>= {gate['min_cosine_min']})",
        flush=True,
    )
    if (
        figures["mean_cosine_vs_fp32"] < gate["mean_cosine_min"]
        or figures["min_cosine_vs_fp32"] < gate["min_cosine_min"]
    ):
        raise BuildError(
            f"{checks.spec.name}: onnx-int8 rejected by its accuracy gate on {cos.size} held-out "
            f"sentences: mean cosine {figures['mean_cosine_vs_fp32']:.4f} (needs >= "
            f"{gate['mean_cosine_min']}), min {figures['min_cosine_vs_fp32']:.4f} (needs >= "
            f"{gate['min_cosine_min']}): leave onnx-int8 out of its backends"
        )
    return figures


def speed(checks: Checks, baseline: Path, candidate: Path, repeats: int = 5) -> dict[str, float]:
    """Sentences/s of two ONNX models on length-sorted batches of 32, interleaved, medians."""
    from models import onnx_export

    batches = checks.in_batches(checks.texts, ordered=True)
    runs = {
        "baseline": onnx_export.runner(baseline, checks.spec),
        "candidate": onnx_export.runner(candidate, checks.spec),
    }
    rates: dict[str, list[float]] = {"baseline": [], "candidate": []}
    for _ in range(repeats):
        for key, run in runs.items():
            started = time.perf_counter()
            for feeds in batches:
                run(feeds)
            rates[key].append(len(checks.texts) / (time.perf_counter() - started))
    base, cand = statistics.median(rates["baseline"]), statistics.median(rates["candidate"])
    return {"baseline_sent_per_s": base, "candidate_sent_per_s": cand, "speedup": cand / base}
