"""A tenant's intent classifier: a SentencePiece embedding bag with a linear layer, trained with TF.

Mean of the pieces' embeddings (padding masked) -> logits -> softmax. With a 2,000-piece vocabulary
and 128-576 dimensions a model weighs 1-5 MB, the size of a typical per-customer intent model.
Exported either as a TensorFlow SavedModel or as ONNX (the graph is written with onnx.helper: it
is five operators, and tf2onnx does not support this TensorFlow).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from serving.features import pad

OPSET = 17


@dataclass
class Classifier:
    embeddings: np.ndarray  # [vocab, dim]
    weights: np.ndarray  # [dim, labels]
    bias: np.ndarray  # [labels]
    labels: list[str]

    @property
    def nbytes(self) -> int:
        return self.embeddings.nbytes + self.weights.nbytes + self.bias.nbytes

    def probabilities(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """Reference implementation in NumPy (what both exports must compute)."""
        feeds = pad(ids)
        mask = feeds["attention_mask"].astype(np.float32)[..., None]
        pooled = (self.embeddings[feeds["input_ids"]] * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
        logits = pooled @ self.weights + self.bias
        exp = np.exp(logits - logits.max(1, keepdims=True))
        return exp / exp.sum(1, keepdims=True)


def accuracy(predicted: Sequence[str], wanted: Sequence[str]) -> float:
    """Share of predictions equal to the wanted intent (NaN for no examples)."""
    if not wanted:
        return float("nan")
    return float(np.mean([p == w for p, w in zip(predicted, wanted, strict=True)]))


def train(
    ids: Sequence[Sequence[int]],
    labels: Sequence[str],
    *,
    vocab: int,
    dim: int,
    epochs: int,
    seed: int = 0,
) -> Classifier:
    """Adam on cross-entropy, batches of 32. Deterministic for a given seed."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    names = sorted(set(labels))
    if len(names) < 2:
        raise ValueError("a classifier needs examples of at least two intents")
    y = np.array([names.index(label) for label in labels], dtype=np.int64)
    feeds = pad(ids)
    x_all = tf.constant(feeds["input_ids"])
    m_all = tf.constant(feeds["attention_mask"], tf.float32)
    rng = np.random.default_rng(seed)
    tf.random.set_seed(seed)
    emb = tf.Variable(rng.normal(0, 0.1, (vocab, dim)).astype(np.float32))
    w = tf.Variable(rng.normal(0, 0.1, (dim, len(names))).astype(np.float32))
    b = tf.Variable(np.zeros(len(names), np.float32))
    variables = [emb, w, b]
    optimizer = tf.keras.optimizers.Adam(0.02)

    @tf.function
    def step(x: tf.Tensor, m: tf.Tensor, target: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            pooled = tf.reduce_sum(tf.gather(emb, x) * m[..., None], 1) / tf.maximum(
                tf.reduce_sum(m, 1, keepdims=True), 1e-9
            )
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(target, pooled @ w + b)
            )
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))

    for _ in range(epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(y), 32):
            batch = order[start : start + 32]
            step(tf.gather(x_all, batch), tf.gather(m_all, batch), tf.constant(y[batch]))
    return Classifier(emb.numpy(), w.numpy(), b.numpy(), names)


def export_onnx(clf: Classifier, path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    k = len(clf.labels)
    inits = [
        numpy_helper.from_array(clf.embeddings, "embeddings"),
        numpy_helper.from_array(clf.weights, "weights"),
        numpy_helper.from_array(clf.bias, "bias"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array([2], np.int64), "axis2"),
        numpy_helper.from_array(np.array(1e-9, np.float32), "eps"),
    ]
    nodes = [
        helper.make_node("Gather", ["embeddings", "input_ids"], ["pieces"]),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask", "axis2"], ["mask3"]),
        helper.make_node("Mul", ["pieces", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask", "axis1"], ["count"], keepdims=1),
        helper.make_node("Max", ["count", "eps"], ["safe_count"]),
        helper.make_node("Div", ["summed", "safe_count"], ["pooled"]),
        helper.make_node("MatMul", ["pooled", "weights"], ["scores"]),
        helper.make_node("Add", ["scores", "bias"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "tenant_intent_classifier",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info(
                "attention_mask", TensorProto.INT64, ["batch", "sequence"]
            ),
        ],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", k])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="bento-bundle"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def export_tf(clf: Classifier, directory: Path) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    class Module(tf.Module):
        def __init__(self) -> None:
            super().__init__(name="tenant_intent_classifier")
            self.embeddings = tf.Variable(clf.embeddings, trainable=False)
            self.weights_ = tf.Variable(clf.weights, trainable=False)
            self.bias = tf.Variable(clf.bias, trainable=False)

        @tf.function(
            input_signature=[
                tf.TensorSpec([None, None], tf.int64, name="input_ids"),
                tf.TensorSpec([None, None], tf.int64, name="attention_mask"),
            ]
        )
        def serve(self, input_ids: tf.Tensor, attention_mask: tf.Tensor) -> dict:
            m = tf.cast(attention_mask, tf.float32)[..., None]
            pooled = tf.reduce_sum(tf.gather(self.embeddings, input_ids) * m, 1) / tf.maximum(
                tf.reduce_sum(m, 1), 1e-9
            )
            return {"probabilities": tf.nn.softmax(pooled @ self.weights_ + self.bias, axis=-1)}

    module = Module()
    tf.saved_model.save(module, str(directory), signatures={"serving_default": module.serve})
