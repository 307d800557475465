"""The tiny checkpoints the catalogue tests serve (tests/checkpoints.py): the tokenizers said to be
the same every run train to the same tokenizer each time (the int8 gates' XLM-R, whose int8 sits a
few decisions from its gate, depends on it)."""

from __future__ import annotations

import pytest

from tests import checkpoints


@pytest.mark.parametrize("architecture", ["xlm-roberta", "roberta"])
def test_the_tokenizer_is_the_same_every_time_it_is_trained(architecture: str) -> None:
    kind = checkpoints.KINDS[architecture]
    first, second = (checkpoints.train_tokenizer(kind).to_str() for _ in range(2))
    assert first == second
