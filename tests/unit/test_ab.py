"""make ab's arithmetic: medians over rounds per figure, and head/base ratios of those medians."""

from __future__ import annotations

import pytest

from loadtests.ab import Sample, summary


def test_summary_is_medians_and_their_ratio() -> None:
    base = [
        Sample(100, 4.0, 0.9, 0.6, 5.0),
        Sample(120, 5.0, 1.0, 0.7, 5.2),
        Sample(90, 4.5, 1.1, 0.8, 5.1),
    ]
    head = [
        Sample(130, 3.5, 0.8, 0.6, 5.0),
        Sample(110, 3.9, 0.7, 0.5, 5.1),
        Sample(125, 3.8, 0.9, 0.7, 4.9),
    ]
    rows = {name: (b, h, ratio) for name, b, h, ratio in summary(base, head)}
    assert list(rows) == [
        "sentences_per_s",
        "p50_ms",
        "tokenizer_ms",
        "runner_main_ms",
        "engine_ms",
    ]
    assert rows["sentences_per_s"] == (100, 125, 1.25)
    assert rows["p50_ms"] == (4.5, 3.8, pytest.approx(3.8 / 4.5))
    assert rows["tokenizer_ms"] == (1.0, 0.8, pytest.approx(0.8))
