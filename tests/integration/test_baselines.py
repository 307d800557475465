"""The hand-written batching baseline batches as its docstring says: sorted by length, cut at a
padded-token budget, every vector the one its sentence gets alone."""

from __future__ import annotations

import numpy as np
import pytest

from serving.features import tokenize

TEXTS = [
    "Hi.",
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog " * 12,  # ~110 tokens: a batch of its own
    "Where is the station?",
    "Thanks!",
    "Could you tell me how the new pricing applies to accounts opened before March?",
] * 6


@pytest.fixture(scope="module")
def server():
    from loadtests.baselines import batching_server

    return batching_server


def test_sub_batches_are_cut_at_the_padded_token_budget(server, monkeypatch) -> None:
    widths: list[tuple[int, int]] = []
    engine = server.engine

    def recording(feeds):
        widths.append(feeds["input_ids"].shape)
        return engine(feeds)

    monkeypatch.setattr(server, "engine", recording)
    sequences = tokenize(server.tokenizer, TEXTS)
    vectors = server.run_sorted(sequences)

    assert sum(rows for rows, _ in widths) == len(TEXTS)
    longest = max(len(s) for s in sequences)
    for rows, width in widths:  # one over-long sentence alone may exceed it
        assert rows * width <= server.BATCH_TOKENS or (rows == 1 and width == longest)
    assert [w for _, w in widths] == sorted(w for _, w in widths)  # shortest first
    alone = np.concatenate([engine(server.pad([s])) for s in sequences])
    np.testing.assert_allclose(vectors, alone, atol=1e-4)  # each row back in its request's place
