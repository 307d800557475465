"""A quick run's raw limit is timed on texts with the corpus's own lengths, not its first ones."""

from __future__ import annotations

import statistics

from loadtests.raw_engine import sample
from models import corpus


def test_the_quick_sample_has_the_corpus_lengths_not_its_first_texts() -> None:
    texts = corpus.load_texts()
    picked = sample(texts, 500)
    assert 500 <= len(picked) < len(texts) and set(picked) <= set(texts)
    mean = statistics.mean(map(len, texts))
    assert abs(statistics.mean(map(len, picked)) - mean) < 0.01 * mean
    assert sample(texts, None) == texts and sample(texts, len(texts)) == texts


def test_every_kth_text_in_length_order() -> None:
    texts = ["x" * n for n in (5, 1, 4, 2, 6, 3)]
    assert sample(texts, 3) == ["x", "xxx", "xxxxx"]
