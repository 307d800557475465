"""Small random-weight checkpoints of the encoder architectures the catalogue serves, laid out as the
model hub lays them out (config.json, model.safetensors, tokenizer.json, tokenizer_config.json).

Only MiniLM's real weights can be had on these machines; these stand in for the rest. Each has a
tokenizer of its architecture's kind trained on the project's corpus: RoBERTa a byte-level BPE,
XLM-RoBERTa a SentencePiece Unigram, DistilBERT (and BERT) a WordPiece, with the special tokens,
pad id and pair template of the real ones. Weights are drawn from a fixed seed, and the RoBERTa
and XLM-RoBERTa tokenizers train to the same tokenizer each time (tests/unit/test_checkpoints.py). The
WordPiece trainer's vocabulary varies from run to run in its ties (the tests of those checkpoints
compare the served model with PyTorch on the same files, whichever they are).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models import corpus


@dataclass(frozen=True)
class Kind:
    architecture: str  # config.json's model_type
    tokenizer: str  # bpe | unigram | wordpiece
    specials: tuple[str, ...]  # in id order, from 0
    token_types: bool

    @property
    def roberta_like(self) -> bool:
        return self.architecture in ("roberta", "xlm-roberta")

    def special(self, role: str) -> str:
        """The token of a role (cls, sep, pad, unk, mask), as the real tokenizers spell it."""
        index = {"cls": 0, "pad": 1, "sep": 2, "unk": 3, "mask": 4}[role]
        if not self.roberta_like:
            index = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}[role]
        return self.specials[index]


ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
KINDS = {
    "roberta": Kind("roberta", "bpe", ROBERTA_SPECIALS, False),
    "xlm-roberta": Kind("xlm-roberta", "unigram", ROBERTA_SPECIALS, False),
    "distilbert": Kind("distilbert", "wordpiece", BERT_SPECIALS, False),
    "bert": Kind("bert", "wordpiece", BERT_SPECIALS, True),
}
HIDDEN, LAYERS, HEADS, FFN = 32, 2, 2, 64
POSITIONS = 128  # tokens each model reads


def sentencepiece_pieces(vocab: int) -> list[tuple[str, float]]:
    """The pieces and scores of a SentencePiece Unigram model of about ``vocab`` pieces trained on
    the corpus, its own control and unknown pieces left out."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=corpus.training_lines(), model_writer=model, vocab_size=vocab,
        model_type="unigram", character_coverage=1.0, num_threads=1, minloglevel=2,
    )  # fmt: skip
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    return [
        (sp.id_to_piece(i), sp.get_score(i))
        for i in range(sp.get_piece_size())
        if not (sp.is_control(i) or sp.is_unknown(i))
    ]


def train_tokenizer(kind: Kind, vocab: int = 1000) -> Any:
    """A ``tokenizers.Tokenizer`` of ``kind``, trained on the corpus, with the post-processor that
    adds the model's special tokens to a text and to a pair."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    specials = list(kind.specials)
    if kind.tokenizer == "bpe":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer: Any = trainers.BpeTrainer(
            vocab_size=vocab,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
    elif kind.tokenizer == "unigram":
        # SentencePiece's trainer, whose pieces are the same every run (tokenizers' Unigram trainer
        # picks different ones from run to run), then served by tokenizers' Unigram as XLM-R's is
        pieces = [(special, 0.0) for special in specials] + sentencepiece_pieces(vocab)
        tokenizer = Tokenizer(models.Unigram(pieces, unk_id=specials.index("<unk>")))
        tokenizer.add_special_tokens(specials)
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = None
    else:
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab, special_tokens=specials)
    if trainer is not None:
        tokenizer.train_from_iterator(corpus.training_lines(), trainer)
    cls, sep = kind.special("cls"), kind.special("sep")
    # RoBERTa's pair: <s> A </s></s> B </s>, one segment; BERT's: [CLS] A [SEP] B [SEP], B's type 1.
    pair = f"{cls} $A {sep} {sep} $B {sep}" if kind.roberta_like else f"{cls} $A {sep} $B:1 {sep}:1"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=pair,
        special_tokens=[(cls, tokenizer.token_to_id(cls)), (sep, tokenizer.token_to_id(sep))],
    )
    return tokenizer


def config(kind: Kind, vocab: int, pad_id: int, labels: list[str] | None = None) -> Any:
    from transformers import AutoConfig

    # transformers' default initialisation (std 0.02) leaves so small a random model's first-token
    # vector the same for every text; ten times wider, its vectors spread as a trained model's do,
    # so a parity check's flipped pairs mean something.
    common: dict[str, Any] = {"vocab_size": vocab, "pad_token_id": pad_id, "initializer_range": 0.2}
    if labels is not None:
        common["id2label"] = dict(enumerate(labels))
        common["label2id"] = {label: i for i, label in enumerate(labels)}
    if kind.architecture == "distilbert":
        sizes = {"dim": HIDDEN, "n_layers": LAYERS, "n_heads": HEADS, "hidden_dim": FFN}
        return AutoConfig.for_model(
            "distilbert", max_position_embeddings=POSITIONS, **sizes, **common
        )
    # RoBERTa's positions start past its pad id.
    positions = POSITIONS + (pad_id + 1 if kind.roberta_like else 0)
    return AutoConfig.for_model(
        kind.architecture,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=positions,
        type_vocab_size=2 if kind.token_types else 1,
        **common,
    )


def write(
    out: Path,
    architecture: str,
    *,
    labels: list[str] | None = None,
    seed: int = 0,
    outlier: float | None = None,
) -> Path:
    """A random-weight ``architecture`` checkpoint in ``out`` (a sequence-classification head of
    ``labels`` when given, else the bare encoder); returns ``out``. ``outlier``: one weight of
    every linear layer set to it, which int8 cannot hold together with the
    others (a model that int8 serves wrong, for the tests of its gate)."""
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification

    kind = KINDS[architecture]
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(kind)
    pad_id = tokenizer.token_to_id(kind.special("pad"))
    cfg = config(kind, tokenizer.get_vocab_size(), pad_id, labels)
    torch.manual_seed(seed)
    loader = AutoModel if labels is None else AutoModelForSequenceClassification
    model = loader.from_config(cfg)
    if outlier is not None:
        with torch.no_grad():
            for layer in model.modules():
                if isinstance(layer, torch.nn.Linear):
                    layer.weight[0, 0] = outlier
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save(str(out / "tokenizer.json"))
    inputs = ["input_ids", "attention_mask"]
    if kind.token_types:
        inputs.insert(1, "token_type_ids")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": POSITIONS,
        "model_input_names": inputs,
        **{f"{role}_token": kind.special(role) for role in ("cls", "sep", "pad", "unk", "mask")},
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return out
