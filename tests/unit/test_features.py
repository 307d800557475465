"""What the engines are fed (serving/features.py): token ids from the fast tokenizer's cheaper
call, and padding."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from serving.features import pad, tokenize


class Encoder:
    """Stands in for ``tokenizers.Tokenizer``: ids per text from encode_batch_fast; the full
    encode_batch (offsets and all) must not be called. tests/integration/test_models.py checks
    that the real tokenizer's two calls give the same ids."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def encode_batch_fast(self, texts: list[str]) -> list[SimpleNamespace]:
        self.calls.append(texts)
        return [SimpleNamespace(ids=[101, *range(len(t)), 102]) for t in texts]

    def encode_batch(self, texts: list[str]) -> list[SimpleNamespace]:
        raise AssertionError("tokenize took the encode call that computes offsets")


def test_tokenize_takes_the_call_without_offsets_once_per_batch() -> None:
    encoder = Encoder()
    assert tokenize(encoder, ("ab", "c")) == [[101, 0, 1, 102], [101, 0, 102]]
    assert encoder.calls == [["ab", "c"]]


def test_pad_pads_to_the_batch_s_longest_with_a_mask() -> None:
    feeds = pad([[101, 7, 102], [101, 102]])
    np.testing.assert_array_equal(feeds["input_ids"], [[101, 7, 102], [101, 102, 0]])
    np.testing.assert_array_equal(feeds["attention_mask"], [[1, 1, 1], [1, 1, 0]])
    np.testing.assert_array_equal(feeds["token_type_ids"], np.zeros((2, 3)))
