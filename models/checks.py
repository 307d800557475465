"""What every built model is checked against before it is stored: agreement with PyTorch on held-out
sentences, the int8 accuracy gate, and a speed comparison of two ONNX graphs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np

from models import corpus, source
from serving.features import Feeds, cosine, load_tokenizer, pad, tokenize

INT8_GATE = {"mean_cosine_min": 0.99, "min_cosine_min": 0.95}


class BuildError(RuntimeError):
    """A model was built but rejected (e.g. an accuracy gate); the message says why."""


class Checks:
    """The held-out check sentences of one MiniLM source, and what is measured on them."""

    def __init__(self, src: source.Source) -> None:
        self.src = src
        self.texts = corpus.heldout_sentences()

    @cache  # noqa: B019 - one instance per build
    def tokenizer(self):
        return load_tokenizer(self.src.path / "tokenizer.json", self.src.max_seq_len)

    def in_batches(self, texts: list[str], ordered: bool = False) -> list[Feeds]:
        """``texts`` tokenized and padded in batches of 32, in their order (mixed lengths, so
        padding must not leak) or ``ordered`` by length."""
        ids = tokenize(self.tokenizer(), texts)
        if ordered:
            ids.sort(key=len)
        return [pad(ids[i : i + 32]) for i in range(0, len(ids), 32)]

    @cache  # noqa: B019
    def batches(self) -> list[Feeds]:
        """The check texts in unsorted batches of 32."""
        return self.in_batches(self.texts)

    @cache  # noqa: B019
    def reference(self) -> np.ndarray:
        from models import torch_reference

        model = torch_reference.load(self.src.path)
        return np.concatenate([torch_reference.embed(model, feeds) for feeds in self.batches()])

    def agreement(self, embed: Callable[[Feeds], np.ndarray]) -> dict[str, float]:
        """How an engine's embeddings compare with PyTorch's on the check sentences."""
        got = np.concatenate([embed(feeds) for feeds in self.batches()])
        ref = self.reference()
        cos = cosine(got, ref)
        return {
            "sentences": len(ref),
            "max_abs_diff_vs_torch": float(np.max(np.abs(got - ref))),
            "mean_cosine_vs_torch": float(np.mean(cos)),
            "min_cosine_vs_torch": float(np.min(cos)),
        }

    def int8_gate(
        self, fp32: Callable[[Feeds], np.ndarray], int8: Callable[[Feeds], np.ndarray]
    ) -> dict[str, float]:
        """int8 against fp32 on the check sentences; raises BuildError below the gate."""
        cos = np.concatenate([cosine(fp32(feeds), int8(feeds)) for feeds in self.batches()])
        figures = {
            "sentences": int(cos.size),
            "mean_cosine_vs_fp32": float(cos.mean()),
            "min_cosine_vs_fp32": float(cos.min()),
        }
        gate = INT8_GATE
        print(
            f"      accuracy gate: mean cosine {figures['mean_cosine_vs_fp32']:.4f} "
            f"(>= {gate['mean_cosine_min']}), min {figures['min_cosine_vs_fp32']:.4f} (>= {gate['min_cosine_min']})",
            flush=True,
        )
        if (
            figures["mean_cosine_vs_fp32"] < gate["mean_cosine_min"]
            or figures["min_cosine_vs_fp32"] < gate["min_cosine_min"]
        ):
            raise BuildError(
                f"onnx int8 rejected by its accuracy gate on {cos.size} held-out sentences: "
                f"mean cosine {figures['mean_cosine_vs_fp32']:.4f} (needs >= {gate['mean_cosine_min']}), "
                f"min {figures['min_cosine_vs_fp32']:.4f} (needs >= {gate['min_cosine_min']})"
            )
        return figures

    def speed(self, baseline: Path, candidate: Path, repeats: int = 5) -> dict[str, float]:
        """Sentences/s of two ONNX models on length-sorted batches of 32, interleaved, medians."""
        from models import onnx_export

        batches = self.in_batches(self.texts, ordered=True)
        sessions = {
            "baseline": onnx_export.session(baseline),
            "candidate": onnx_export.session(candidate),
        }
        rates: dict[str, list[float]] = {"baseline": [], "candidate": []}
        for _ in range(repeats):
            for key, sess in sessions.items():
                started = time.perf_counter()
                for feeds in batches:
                    onnx_export.embed(sess, feeds)
                rates[key].append(len(self.texts) / (time.perf_counter() - started))
        base, cand = statistics.median(rates["baseline"]), statistics.median(rates["candidate"])
        return {"baseline_sent_per_s": base, "candidate_sent_per_s": cand, "speedup": cand / base}
