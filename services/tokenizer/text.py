"""The 'pre' stage: text to token ids. Each catalogue model has its own tokenizer
(services/tokenizer/models.py); this is the rest: the SentencePiece model that tenants' whole models
read, and where a request's tokenizing runs (inline, or in a thread for large work)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

Encoded = TypeVar("Encoded")

# Below this many characters a request is tokenized on the event loop: a thread hop would cost more
# than the work. Above it (long texts, big batches), in a thread, so other requests keep flowing.
INLINE_CHARS = 8192


def keep_to_one_core() -> None:
    """The fast tokenizer's own thread pool would take a second core for a batch; in a server that
    core belongs to the engines. Its documented switch, unless the environment already says."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class Tokenizers:
    def __init__(self, sentencepiece_model: Path) -> None:
        import sentencepiece

        keep_to_one_core()
        self.spm = sentencepiece.SentencePieceProcessor(model_file=str(sentencepiece_model))

    def sentencepiece(self, texts: Sequence[str]) -> list[list[int]]:
        # sentencepiece itself, not the transformers tokenizer stored beside it: the reference.
        ids: list[list[int]] = self.spm.encode(list(texts))
        return ids

    def tenant_pieces(self, texts: Sequence[str]) -> list[list[int]]:
        """SentencePiece ids as tenant models take them: a text of nothing the model has pieces for
        (control characters only, say) encodes to no ids at all; it becomes the unknown piece, so
        the model still answers for it instead of the request failing."""
        unknown = [self.spm.unk_id()]
        return [ids or unknown for ids in self.sentencepiece(texts)]

    @staticmethod
    async def run(
        encode: Callable[..., Encoded], texts: Sequence[str] | Sequence[tuple[str, str]], *args: Any
    ) -> Encoded:
        """``encode(texts, *args)``: texts, or text pairs, to their tokens."""
        chars = sum(len(t) if isinstance(t, str) else len(t[0]) + len(t[1]) for t in texts)
        if chars <= INLINE_CHARS:
            return encode(texts, *args)
        return await asyncio.to_thread(encode, texts, *args)
