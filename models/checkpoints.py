"""What a catalogue entry's checkpoint is, read from its files before anything is built: its
architecture, sizes, tokenizer and head, checked against what the entry asks of it.

Every entry of a catalogue is checked first (``check``), so a catalogue with a bad entry builds
nothing; each problem names the entry and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.catalogue import BACKENDS, Entry, ModelSpec

# The architectures every backend here can export (the ONNX exporter traces transformers' own
# modules; the TensorFlow one is written for these: models/tf_encoder.py).
EXPORTABLE = {backend: ("bert", "roberta", "xlm-roberta", "distilbert") for backend in BACKENDS}


class CheckpointError(ValueError):
    """A checkpoint that the entry cannot be built from: the message names the entry and the field."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    config: dict[str, Any]

    @property
    def architecture(self) -> str:
        return str(self.config.get("model_type", "unknown"))

    @property
    def hidden(self) -> int:
        return int(self.config.get("hidden_size") or self.config.get("dim") or 0)

    @property
    def positions(self) -> int:
        """Tokens the model can read: its position table (RoBERTa's starts past its pad id)."""
        limit = int(self.config.get("max_position_embeddings", 512))
        if self.architecture in ("roberta", "xlm-roberta"):
            limit -= int(self.config.get("pad_token_id", 1)) + 1
        return limit

    @property
    def labels(self) -> list[str] | None:
        """The classification head's labels (id2label, in id order), or None without a head."""
        heads = [a for a in self.config.get("architectures") or [] if "SequenceClassification" in a]
        if not heads:
            return None
        id2label = self.config.get("id2label") or {}
        count = int(self.config.get("num_labels") or len(id2label) or 2)
        return [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(count)]


def read(path: Path) -> Checkpoint:
    return Checkpoint(path, json.loads((path / "config.json").read_text()))


def check(entry: Entry, checkpoint: Checkpoint) -> None:
    """Raise CheckpointError unless ``checkpoint`` can serve ``entry`` on every listed backend."""
    where = f"models ({entry.name})"
    for backend in entry.backends:
        if checkpoint.architecture not in EXPORTABLE[backend]:
            raise CheckpointError(
                f"{where}: backends: {backend} cannot export a {checkpoint.architecture!r} model "
                f"(it exports {', '.join(EXPORTABLE[backend])}); list other backends or another "
                "checkpoint"
            )
    labels = checkpoint.labels
    if entry.task in ("rerank", "classify") and labels is None:
        raise CheckpointError(
            f"{where}: task: {entry.task} needs a checkpoint with a sequence-classification head "
            f"(config.json's architectures has none: {checkpoint.config.get('architectures')})"
        )
    if entry.task == "rerank" and labels is not None and len(labels) != 1:
        raise CheckpointError(
            f"{where}: task: rerank needs a head of one logit (a relevance score); this one has "
            f"{len(labels)} labels: use task: classify"
        )
    if entry.max_length is not None and entry.max_length > checkpoint.positions:
        raise CheckpointError(
            f"{where}: max_length: {entry.max_length} is more than the model reads "
            f"({checkpoint.positions} positions)"
        )
    if entry.dimensions is not None:
        if entry.task != "embed":
            raise CheckpointError(f"{where}: dimensions: only embed models have dimensions")
        too_wide = [d for d in entry.dimensions if d > checkpoint.hidden]
        if too_wide:
            raise CheckpointError(
                f"{where}: dimensions: {too_wide} exceed the model's {checkpoint.hidden}"
            )


def spec(entry: Entry, checkpoint: Checkpoint, tokenizer: Any, token_types: bool) -> ModelSpec:
    """What serving the entry needs at run time, from the entry, its checkpoint and tokenizer
    (a ``tokenizers.Tokenizer``); recorded in each of its store entries."""
    labels = checkpoint.labels if entry.task != "embed" else None
    pad_id = tokenizer.token_to_id(tokenizer_pad_token(tokenizer))
    return ModelSpec(
        name=entry.name,
        task=entry.task,
        architecture=checkpoint.architecture,
        pooling=entry.pooling,
        normalize=entry.normalize,
        max_length=entry.max_length or checkpoint.positions,
        dim=len(labels) if labels is not None else checkpoint.hidden,
        dimensions=entry.dimensions,
        vocab_size=tokenizer.get_vocab_size(),
        pad_id=int(pad_id if pad_id is not None else 0),
        token_types=token_types,
        labels=tuple(labels) if labels is not None else None,
        backends=entry.backends,
    )


def tokenizer_pad_token(tokenizer: Any) -> str:
    """The pad token a ``tokenizers.Tokenizer`` pads with (its padding settings, or the usual
    names when it has none)."""
    padding = tokenizer.padding
    if padding and padding.get("pad_token"):
        return str(padding["pad_token"])
    for token in ("[PAD]", "<pad>", "<PAD>"):
        if tokenizer.token_to_id(token) is not None:
            return token
    return "[PAD]"
