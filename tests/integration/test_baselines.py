"""The hand-written batching baseline batches as its docstring says: sorted by length, each engine
call as many rows as fit in the padded-token budget, every vector the one its sentence gets alone,
and ORT's thread spinning off. The host's floor (make profile) answers as /embed does."""

from __future__ import annotations

import numpy as np
import pytest

from serving.features import tokenize

TEXTS = [
    "Hi.",
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog " * 12,  # ~110 tokens: 4 to a call at most
    "Where is the station?",
    "Thanks!",
    "Could you tell me how the new pricing applies to accounts opened before March?",
] * 6


@pytest.fixture(scope="module")
def server():
    from loadtests.baselines import batching_server

    return batching_server


def test_each_engine_call_is_as_many_rows_as_fit_the_padded_token_budget(
    server, monkeypatch
) -> None:
    calls: list[np.ndarray] = []
    engine = server.engine

    def recording(feeds):
        calls.append(feeds["attention_mask"])
        return engine(feeds)

    monkeypatch.setattr(server, "engine", recording)
    sequences = tokenize(server.tokenizer, TEXTS)
    vectors = server.run_sorted(sequences)

    assert sum(len(mask) for mask in calls) == len(TEXTS)
    lengths = [mask.sum(axis=1) for mask in calls]
    assert [len(c) for c in lengths] != [1] * len(TEXTS)  # batched, not one call a sentence
    for i, (mask, rows) in enumerate(zip(calls, lengths, strict=True)):
        assert mask.size <= server.BATCH_TOKENS  # rows x the widest row's length
        assert mask.shape[1] == rows.max() and list(rows) == sorted(rows)  # shortest first
        if i + 1 < len(calls):  # cut only because the next row would not fit
            assert (len(rows) + 1) * lengths[i + 1][0] > server.BATCH_TOKENS
    alone = np.concatenate([engine(server.pad([s])) for s in sequences])
    np.testing.assert_allclose(vectors, alone, atol=1e-4)  # each row back in its request's place


def test_ort_spinning_is_off(server) -> None:
    options = server.engine.session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
