"""A SentencePiece unigram model trained on the project's corpus, and a transformers tokenizer over it.

The service tokenizes with ``sentencepiece`` itself (the reference). The transformers tokenizer is
stored beside it for users of transformers; its ids are checked against sentencepiece's here.
Known difference, found while building this: literal control-token strings in the text ("</s>",
"<pad>") are parsed as special tokens by the transformers tokenizer and as plain text by
sentencepiece.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from serving.contracts import SPM_VOCAB

# T5's conventions (pad 0, eos 1, unk 2, no bos) so T5Tokenizer maps ids one to one.
# A 2,000-piece vocabulary (serving.contracts.SPM_VOCAB) is what the corpus supports (sentencepiece refuses more than ~2,900);
# one thread keeps training deterministic.
TRAINER: dict[str, Any] = {
    "model_type": "unigram",
    "vocab_size": SPM_VOCAB,
    "character_coverage": 1.0,
    "pad_id": 0,
    "eos_id": 1,
    "unk_id": 2,
    "bos_id": -1,
    "num_threads": 1,
}


def build(lines: Sequence[str], out: Path, check_lines: int = 1000) -> dict[str, int]:
    import sentencepiece as spm
    from transformers import T5Tokenizer

    corpus = out / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(out / "spiece"), minloglevel=2, **TRAINER
    )
    corpus.unlink()
    # T5Tokenizer(vocab_file=...) silently ignores the file in transformers 5; from_pretrained on a
    # directory holding spiece.model is the form that reads it.
    logging.getLogger("transformers").setLevel(logging.ERROR)
    tokenizer = T5Tokenizer.from_pretrained(str(out), extra_ids=0)
    tokenizer.save_pretrained(str(out / "transformers"))
    processor = spm.SentencePieceProcessor(model_file=str(out / "spiece.model"))
    checked = list(lines[:check_lines])
    mismatches = sum(
        processor.encode(line) != tokenizer.encode(line, add_special_tokens=False)
        for line in checked
    )
    return {
        "lines": len(checked),
        "mismatches": mismatches,
        "vocab_size": processor.get_piece_size(),
    }
