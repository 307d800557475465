"""BERT-family encoders as framework-native TensorFlow modules, read straight from model.safetensors.

transformers 5 has no TensorFlow models, so the encoders are written here: BERT (MiniLM included),
RoBERTa, XLM-RoBERTa (RoBERTa's layout) and DistilBERT, with what a catalogue entry serves on top:
mean or CLS pooling and L2 normalisation (``embed``), or the checkpoint's sequence-classification
head (``rerank``, ``classify``). Saved as a SavedModel whose ``serving_default`` signature takes
the same inputs as the ONNX graph (``input_ids``, ``attention_mask``, and ``token_type_ids`` for a
model that has them) and returns the same output (``sentence_embedding`` or ``logits``).

Work is done on [batch * seq, hidden] matrices: 2-D GEMMs were several times faster than 3-D @ 2-D
in TensorFlow here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from safetensors.numpy import load_file

from serving.catalogue import ModelSpec

# The checkpoint's model_type -> its layout: where the encoder's weights sit and how they are named.
BERT_LIKE = ("bert", "roberta", "xlm-roberta")
SUPPORTED = (*BERT_LIKE, "distilbert")


def _prefix(weights: dict[str, np.ndarray]) -> str:
    """What the encoder's weight names start with ('' for a base model, 'bert.' and the like for a
    checkpoint with a head)."""
    for key in weights:
        if key.endswith("embeddings.word_embeddings.weight"):
            return key.removesuffix("embeddings.word_embeddings.weight")
    raise ValueError("no embeddings.word_embeddings.weight in the checkpoint")


class TFEncoder(tf.Module):
    def __init__(
        self, weights: dict[str, np.ndarray], config: dict[str, Any], spec: ModelSpec
    ) -> None:
        super().__init__(name="encoder")
        self.kind = config["model_type"]
        if self.kind not in SUPPORTED:
            raise ValueError(f"model_type {self.kind!r} has no TensorFlow encoder here")
        self.spec = spec
        distil = self.kind == "distilbert"
        self.hidden = int(config["dim" if distil else "hidden_size"])
        self.heads = int(config["n_heads" if distil else "num_attention_heads"])
        self.layers = int(config["n_layers" if distil else "num_hidden_layers"])
        self.eps = 1e-12 if distil else float(config["layer_norm_eps"])
        act = config.get("activation" if distil else "hidden_act", "gelu")
        if act != "gelu":
            raise ValueError(f"activation {act!r} is not implemented here (gelu is)")
        # RoBERTa's positions count from its pad id + 1 (position ids from the input ids).
        self.position_offset = int(config.get("pad_token_id", 1)) if self.kind != "bert" else None
        if distil:
            self.position_offset = None
        self.pad_id = spec.pad_id
        prefix = _prefix(weights)

        def var(key: str, transpose: bool = False, absolute: bool = False) -> tf.Variable:
            name = key if absolute else prefix + key
            value = weights[name].T if transpose else weights[name]
            return tf.Variable(
                np.ascontiguousarray(value), trainable=False, name=name.replace(".", "/")
            )

        def dense(name: str, absolute: bool = False) -> tuple[tf.Variable, tf.Variable]:
            # PyTorch Linear stores [out, in]; transpose once here so the graph does x @ W.
            return var(name + ".weight", True, absolute), var(name + ".bias", absolute=absolute)

        def norm(name: str) -> tuple[tf.Variable, tf.Variable]:
            return var(name + ".weight"), var(name + ".bias")

        self.word = var("embeddings.word_embeddings.weight")
        self.position = var("embeddings.position_embeddings.weight")
        self.token_type = None if distil else var("embeddings.token_type_embeddings.weight")
        self.emb_norm = norm("embeddings.LayerNorm")
        self.blocks = []
        for i in range(self.layers):
            if distil:
                p = f"transformer.layer.{i}."
                names = {
                    "q": "attention.q_lin", "k": "attention.k_lin", "v": "attention.v_lin",
                    "o": "attention.out_lin", "norm1": "sa_layer_norm", "up": "ffn.lin1",
                    "down": "ffn.lin2", "norm2": "output_layer_norm",
                }  # fmt: skip
            else:
                p = f"encoder.layer.{i}."
                names = {
                    "q": "attention.self.query", "k": "attention.self.key",
                    "v": "attention.self.value", "o": "attention.output.dense",
                    "norm1": "attention.output.LayerNorm", "up": "intermediate.dense",
                    "down": "output.dense", "norm2": "output.LayerNorm",
                }  # fmt: skip
            self.blocks.append(
                {k: (norm if "norm" in k else dense)(p + n) for k, n in names.items()}
            )
        self.head: dict[str, tuple[tf.Variable, tf.Variable]] = {}
        if spec.task != "embed":
            if self.kind == "bert":
                self.head = {
                    "pool": dense(prefix + "pooler.dense", absolute=True),
                    "out": dense("classifier", absolute=True),
                }
            elif self.kind == "distilbert":
                self.head = {
                    "pool": dense("pre_classifier", absolute=True),
                    "out": dense("classifier", absolute=True),
                }
            else:
                self.head = {
                    "pool": dense("classifier.dense", absolute=True),
                    "out": dense("classifier.out_proj", absolute=True),
                }

    def _norm(self, x: tf.Tensor, params: tuple[tf.Variable, tf.Variable]) -> tf.Tensor:
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + self.eps) * params[0] + params[1]

    def encode(
        self, input_ids: tf.Tensor, attention_mask: tf.Tensor, token_type_ids: tf.Tensor | None
    ) -> tf.Tensor:
        batch, seq = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
        head_dim = self.hidden // self.heads
        if self.position_offset is None:
            positions = tf.gather(self.position, tf.range(seq))[tf.newaxis]
        else:  # RoBERTa: positions from the ids, pads at the pad id's own position
            real = tf.cast(tf.not_equal(input_ids, self.pad_id), tf.int64)
            ids = tf.cumsum(real, axis=1) * real + self.position_offset
            positions = tf.gather(self.position, ids)
        x = tf.gather(self.word, input_ids) + positions
        if self.token_type is not None:
            types = tf.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            x += tf.gather(self.token_type, types)
        x = tf.reshape(self._norm(x, self.emb_norm), [-1, self.hidden])
        mask = tf.cast(attention_mask, tf.float32)
        bias = (1.0 - mask)[:, tf.newaxis, tf.newaxis, :] * tf.float32.min

        def split_heads(t: tf.Tensor) -> tf.Tensor:
            return tf.transpose(tf.reshape(t, [batch, seq, self.heads, head_dim]), [0, 2, 1, 3])

        for block in self.blocks:
            q, k, v = (split_heads(x @ block[n][0] + block[n][1]) for n in ("q", "k", "v"))
            scores = tf.matmul(q, k, transpose_b=True) / math.sqrt(head_dim) + bias
            context = tf.matmul(tf.nn.softmax(scores, axis=-1), v)
            context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [-1, self.hidden])
            x = self._norm(context @ block["o"][0] + block["o"][1] + x, block["norm1"])
            up = tf.nn.gelu(x @ block["up"][0] + block["up"][1], approximate=False)
            x = self._norm(up @ block["down"][0] + block["down"][1] + x, block["norm2"])
        hidden = tf.reshape(x, [batch, seq, self.hidden])
        if self.spec.task != "embed":
            return self._classify(hidden[:, 0])
        if self.spec.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            summed = tf.reduce_sum(hidden * mask[:, :, tf.newaxis], axis=1)
            pooled = summed / tf.maximum(tf.reduce_sum(mask, axis=1, keepdims=True), 1e-9)
        return tf.math.l2_normalize(pooled, axis=1) if self.spec.normalize else pooled

    def _classify(self, first: tf.Tensor) -> tf.Tensor:
        pool, out = self.head["pool"], self.head["out"]
        x = first @ pool[0] + pool[1]
        x = tf.nn.relu(x) if self.kind == "distilbert" else tf.tanh(x)
        return x @ out[0] + out[1]


def export(source_dir: Path, spec: ModelSpec, out_dir: Path) -> None:
    weights = load_file(str(source_dir / "model.safetensors"))
    config = json.loads((source_dir / "config.json").read_text())
    module = TFEncoder(weights, config, spec)
    signature = [tf.TensorSpec([None, None], tf.int64, name=name) for name in spec.input_names]
    output = spec.output_name

    if spec.token_types:

        @tf.function(input_signature=signature)
        def serve(
            input_ids: tf.Tensor, attention_mask: tf.Tensor, token_type_ids: tf.Tensor
        ) -> dict:
            return {output: module.encode(input_ids, attention_mask, token_type_ids)}

    else:

        @tf.function(input_signature=signature)
        def serve(input_ids: tf.Tensor, attention_mask: tf.Tensor) -> dict:
            return {output: module.encode(input_ids, attention_mask, None)}

    module.serve = serve
    tf.saved_model.save(module, str(out_dir), signatures={"serving_default": serve})
