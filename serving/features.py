"""From text to engine inputs and back: a model's fast tokenizer, dynamic padding, cosine.

Shared by the model builder, the parity check, the tokenizer service (tokenize, cosine) and the
runners (pad): one definition of what the engines are fed and of how vectors are compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

Feeds = dict[str, np.ndarray]


def load_tokenizer(tokenizer_json: Path, max_len: int) -> Any:
    """A model's fast tokenizer (``tokenizers.Tokenizer``), padding nothing and cutting at
    ``max_len``.

    A checkpoint's tokenizer.json may pad every sequence to a fixed length (MiniLM's pads to 128)
    and truncate below the model's limit: left as is, every sequence is computed over the fixed
    length (slow) and longer texts are cut short of what the model reads."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_len)
    return tokenizer


def tokenize(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    # encode_batch_fast: encode_batch without the character offsets (left at zero), which nothing
    # here reads (docs/decisions/0007-per-request-trims.md).
    return [encoding.ids for encoding in tokenizer.encode_batch_fast(list(texts))]


def pad(sequences: Sequence[Sequence[int]], pad_id: int = 0, token_types: bool = True) -> Feeds:
    """Pad to the longest sequence of this batch (dynamic padding), single-segment inputs;
    ``token_type_ids`` (all 0) only for a model that takes them."""
    width = max(len(s) for s in sequences)
    input_ids = np.full((len(sequences), width), pad_id, dtype=np.int64)
    attention_mask = np.zeros((len(sequences), width), dtype=np.int64)
    for row, seq in enumerate(sequences):
        input_ids[row, : len(seq)] = seq
        attention_mask[row, : len(seq)] = 1
    feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
    if token_types:
        feeds["token_type_ids"] = np.zeros_like(input_ids)
    return feeds


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two [n, dim] arrays, clipped to [-1, 1] (float rounding
    gives 1.0000001 for identical texts)."""
    scores = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return np.clip(scores, -1.0, 1.0)
