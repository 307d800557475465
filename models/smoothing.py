"""SmoothQuant for the int8 build: move activation outliers into the weights before quantising.

Dynamic int8 quantises a MatMul's input with one scale for the whole tensor, so a few channels with
large values (MiniLM has them, most of all in its GELU outputs) leave the other channels a handful
of int8 steps. Dividing input channel k by s_k and multiplying weight row k by s_k leaves the
product unchanged in exact arithmetic and evens out the ranges the two int8 grids must cover
(Xiao et al., "SmoothQuant", ICML 2023): s_k = max|X_k|^alpha / max|W_k|^(1 - alpha), X's maxima
taken over calibration sentences, alpha the share of the difficulty moved into the weights.

Written here rather than taken from a library: ONNX Runtime's only smoother is
``quantize_static(extra_options={"SmoothQuant": True})``, which calls neural-compressor 2.x (it
imports ``pkg_resources``, gone from current setuptools) and works for static quantisation only;
its successor, onnx-neural-compressor, pins numpy<2. Where 1/s goes: SmoothQuant's own models are
pre-LayerNorm and fold it into the LayerNorm's weights, but MiniLM is post-LayerNorm (each
LayerNorm's output also feeds a residual Add) and GELU's output has no linear producer, so every
smoothed input gets a Mul node, one rule for all (only the attention context, linear in the value
projection, could take it in its weights). The Muls cost int8 ~2-5 % of its speed (measured).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving.features import Feeds


@dataclass(frozen=True)
class Smoothed:
    """What ``smooth`` did: the inputs it scaled and the MatMuls that read them."""

    inputs: list[str]
    matmuls: list[str]


def weighted_matmuls(graph, skip: Callable[[str], bool]) -> dict[str, list]:
    """MatMul nodes whose weight is an initializer (in MiniLM's export, every MatMul that
    ``quantize_dynamic`` quantises), grouped by the tensor they read: one scale per input, shared
    by every MatMul reading it (query, key and value read the same LayerNorm output). Nodes for
    which ``skip(name)`` holds are left out. A weight that another node reads too is refused: it
    is scaled in place, which would change what that node computes."""
    constants = {init.name for init in graph.initializer}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    groups: dict[str, list] = {}
    for node in graph.node:
        if node.op_type == "MatMul" and node.input[1] in constants and not skip(node.name):
            if readers[node.input[1]] > 1:
                raise ValueError(
                    f"weight {node.input[1]!r} of {node.name!r} is read by "
                    f"{readers[node.input[1]]} nodes: smoothing scales it in place"
                )
            groups.setdefault(node.input[0], []).append(node)
    return groups


def channel_maxima(model, tensors: list[str], feeds: Iterable[Feeds]) -> dict[str, np.ndarray]:
    """max |x| per channel (last axis) of each tensor over the real tokens of every batch: rows
    where ``attention_mask`` is 0 are padding and must not widen a range."""
    import onnx
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {out.name for out in probe.graph.output}
    probe.graph.output.extend(
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
        for name in tensors
        if name not in known
    )
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    feed_names = [i.name for i in session.get_inputs()]
    maxima: dict[str, np.ndarray] = {}
    for batch in feeds:
        real = batch["attention_mask"].astype(bool)
        values = session.run(tensors, {name: batch[name] for name in feed_names})
        for name, value in zip(tensors, values, strict=True):
            top = np.abs(value[real]).max(axis=0)
            maxima[name] = np.maximum(maxima[name], top) if name in maxima else top
    return maxima


def smooth(
    model,
    calibration: Iterable[Feeds],
    alpha: Callable[[str], float],
    skip: Callable[[str], bool] = lambda name: False,
) -> Smoothed:
    """Smooth ``model`` (an ``onnx.ModelProto``, changed in place) for int8: for each input of a
    weighted MatMul (``weighted_matmuls``), a Mul by 1/s after the tensor is made and weight rows
    times s. ``alpha(name)`` gives the migration strength of the group whose first MatMul is
    ``name``. The graph computes what it did, up to float rounding."""
    from onnx import helper, numpy_helper

    graph = model.graph
    groups = weighted_matmuls(graph, skip)
    maxima = channel_maxima(model, list(groups), calibration)
    weights = {init.name: init for init in graph.initializer}
    made_by = {out: index for index, node in enumerate(graph.node) for out in node.output}
    inserts: list[tuple[int, Any]] = []  # (position, a NodeProto)
    for tensor, matmuls in groups.items():
        rows = [numpy_helper.to_array(weights[node.input[1]]) for node in matmuls]
        weight_max = np.max([np.abs(w).max(axis=1) for w in rows], axis=0)
        strength = alpha(matmuls[0].name)
        # Floors keep a channel that is all zeros (in X or in W) from a 0 or infinite scale.
        scale = np.maximum(maxima[tensor], 1e-5) ** strength / np.maximum(weight_max, 1e-5) ** (
            1 - strength
        )
        scale = scale.astype(np.float32)
        inverse = f"{tensor}/smooth_inverse"
        graph.initializer.append(numpy_helper.from_array(1.0 / scale, inverse))
        smoothed = f"{tensor}/smoothed"
        mul = helper.make_node("Mul", [tensor, inverse], [smoothed], name=f"{tensor}/smooth")
        inserts.append((made_by.get(tensor, -1) + 1, mul))
        for node, w in zip(matmuls, rows, strict=True):
            weights[node.input[1]].CopyFrom(
                numpy_helper.from_array((w * scale[:, None]).astype(np.float32), node.input[1])
            )
            node.input[0] = smoothed
    # Each Mul right after the node that makes its input: the graph stays topologically sorted.
    nodes = list(graph.node)
    for position, mul in sorted(inserts, key=lambda item: item[0], reverse=True):
        nodes.insert(position, mul)
    del graph.node[:]
    graph.node.extend(nodes)
    return Smoothed(
        inputs=list(groups), matmuls=[node.name for group in groups.values() for node in group]
    )


def by_pattern(default: float, patterns: dict[str, float]) -> Callable[[str], float]:
    """``alpha`` for ``smooth``: the value of the first regular expression that matches a node's
    name, else ``default``."""

    def alpha(name: str) -> float:
        return next((a for p, a in patterns.items() if re.search(p, name)), default)

    return alpha
