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


def load_tokenizer(tokenizer_json: Path, max_len: int, pairs: bool = False) -> Any:
    """A model's fast tokenizer (``tokenizers.Tokenizer``), padding nothing and cutting at
    ``max_len``; with ``pairs`` (a reranker's or a classifier's), a pair is cut from its second
    text only (``only_second``): a query is kept whole and the passage it is scored against cut.

    A checkpoint's tokenizer.json may pad every sequence to a fixed length (MiniLM's pads to 128)
    and truncate below the model's limit: left as is, every sequence is computed over the fixed
    length (slow) and longer texts are cut short of what the model reads."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_len, strategy="only_second" if pairs else "longest_first")
    return tokenizer


def tokenize(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    # encode_batch_fast: encode_batch without the character offsets (left at zero), which nothing
    # here reads (docs/decisions/0007-per-request-trims.md).
    return [encoding.ids for encoding in tokenizer.encode_batch_fast(list(texts))]


class PairTooLong(ValueError):
    """A pair whose first text alone is longer than the model reads (``only_second`` cannot cut
    it): ``index`` is the pair's."""

    def __init__(self, index: int) -> None:
        super().__init__(f"pair {index}: its first text alone is longer than the model reads")
        self.index = index


def tokenize_pairs(
    tokenizer: Any, pairs: Sequence[tuple[str, str]]
) -> tuple[list[list[int]], list[int]]:
    """Each pair encoded as the model's tokenizer encodes a pair (its special tokens, its
    truncation), and where its second segment starts: the first position of token type 1 (the
    sequence's length where the tokenizer gives none, as RoBERTa's does)."""
    try:
        encodings = tokenizer.encode_batch_fast(list(pairs))
    except Exception:  # tokenizers names no pair: find the one that cannot be cut
        for index, pair in enumerate(pairs):
            try:
                tokenizer.encode(*pair)
            except Exception:
                raise PairTooLong(index) from None
        raise
    ids = [encoding.ids for encoding in encodings]
    starts = []
    for encoding in encodings:
        types = encoding.type_ids
        starts.append(types.index(1) if 1 in types else len(types))
    return ids, starts


def pad(
    sequences: Sequence[Sequence[int]],
    pad_id: int = 0,
    token_types: bool = True,
    segments: Sequence[int] | None = None,
) -> Feeds:
    """Pad to the longest sequence of this batch (dynamic padding); ``token_type_ids`` only for a
    model that takes them: 1 from each row's ``segments`` entry (where a pair's second text
    starts) to its end, 0 elsewhere (all 0 without ``segments``: single texts)."""
    width = max(len(s) for s in sequences)
    input_ids = np.full((len(sequences), width), pad_id, dtype=np.int64)
    attention_mask = np.zeros((len(sequences), width), dtype=np.int64)
    for row, seq in enumerate(sequences):
        input_ids[row, : len(seq)] = seq
        attention_mask[row, : len(seq)] = 1
    feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
    if token_types:
        if segments is None:
            feeds["token_type_ids"] = np.zeros_like(input_ids)
        else:
            starts = np.asarray(segments, dtype=np.int64)[:, None]
            second = np.arange(width, dtype=np.int64)[None, :] >= starts
            feeds["token_type_ids"] = (second & (attention_mask == 1)).astype(np.int64)
    return feeds


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two [n, dim] arrays, clipped to [-1, 1] (float rounding
    gives 1.0000001 for identical texts)."""
    scores = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return np.clip(scores, -1.0, 1.0)
