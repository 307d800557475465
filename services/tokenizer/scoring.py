"""From a head's logits to what the rerank and classify routes answer: relevance scores, their
order, and labels with scores."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def relevance(logits: np.ndarray, raw: bool = False) -> np.ndarray:
    """A reranker's score per row: its one logit's sigmoid (0 to 1), or the logit (``raw``)."""
    scores = logits[:, 0].astype(np.float64)
    return scores if raw else 1.0 / (1.0 + np.exp(-scores))


def ranking(scores: np.ndarray, top_n: int | None = None) -> list[int]:
    """Row indices, the highest score first (ties in request order), the first ``top_n``."""
    order = np.argsort(-scores, kind="stable")
    return [int(i) for i in order[:top_n]]


def label_scores(
    logits: np.ndarray, labels: Sequence[str], raw: bool = False
) -> list[list[dict[str, float | str]]]:
    """Each row's labels with their scores, the best first: the softmax over the labels (the
    sigmoid of a one-label head), or the logits (``raw``)."""
    values = logits.astype(np.float64)
    if not raw:
        if values.shape[1] == 1:
            values = 1.0 / (1.0 + np.exp(-values))
        else:
            shifted = np.exp(values - values.max(axis=1, keepdims=True))
            values = shifted / shifted.sum(axis=1, keepdims=True)
    return [
        [{"label": labels[k], "score": float(row[k])} for k in np.argsort(-row, kind="stable")]
        for row in values
    ]
