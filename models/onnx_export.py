"""ONNX exports of a catalogue model: fp32, and int8 (smoothed, then quantised) behind its gate.

Both take the model's inputs (``ModelSpec.input_names``: int64 ``input_ids``, ``attention_mask``,
and ``token_type_ids`` for a model that has them) with dynamic batch and sequence axes, and give
its output (``sentence_embedding``, pooled and normalised inside the graph as the entry asks, or a
head's ``logits``): the contract a runner checks at load.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from serving.catalogue import ModelSpec
from serving.features import Feeds

OPSET = 17
# Per-channel weights and a reduced range (7-bit weights): per-tensor u8s8 saturated on AVX2 and
# lost accuracy; with a reduced range AVX2's u8s8 products cannot saturate (VNNI's never do), so a
# host without VNNI does not lose accuracy that a build host with it never saw.
QUANTISATION: dict[str, Any] = {
    "per_channel": True,
    "reduce_range": True,
    "weight_type": "QInt8",
    "op_types_to_quantize": ["MatMul"],
}
# SmoothQuant before quantising (models/smoothing.py). The feed-forward down-projections read GELU's
# outputs, whose outlier channels need more of the difficulty moved into the weights; BERT's first
# layer's is kept in fp32. Chosen on MiniLM's gate sentences and checked on the load-test corpus
# (docs/decisions/0016-int8-smoothing.md); in other architectures the names do not match, and every
# MatMul is smoothed alike.
FFN_DOWN = r"layer\.\d+/output/dense/MatMul$"
SMOOTHING: dict[str, Any] = {
    "alpha": 0.5,
    "alpha_by_node": {FFN_DOWN: 0.6},
    "calibration_sentences": 512,
}
FP32_NODES = r"layer\.0/output/dense/MatMul$"


def export_fp32(source_dir: Path, spec: ModelSpec, out_path: Path) -> None:
    import torch

    from models import reference

    model = reference.load(source_dir, spec)
    dummy = tuple(torch.ones((2, 8), dtype=torch.int64) for _ in spec.input_names)
    axes = {name: {0: "batch", 1: "sequence"} for name in spec.input_names}
    # The TorchScript exporter writes one self-contained file; dynamo=True needs onnxscript and
    # writes external data.
    torch.onnx.export(
        model,
        dummy,
        str(out_path),
        input_names=spec.input_names,
        output_names=[spec.output_name],
        dynamic_axes={**axes, spec.output_name: {0: "batch"}},
        opset_version=OPSET,
        dynamo=False,
    )


def quantise(source_path: Path, out_path: Path, calibration: list[Feeds]) -> dict[str, Any]:
    """SmoothQuant on ``calibration`` batches, then dynamic int8 quantisation; returns what was
    smoothed and the MatMul nodes kept in fp32."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from models import smoothing

    model = onnx.load(str(source_path))
    kept = [node.name for node in model.graph.node if re.search(FP32_NODES, node.name)]
    smoothed = smoothing.smooth(
        model,
        calibration,
        smoothing.by_pattern(SMOOTHING["alpha"], SMOOTHING["alpha_by_node"]),
        skip=lambda name: name in kept,
    )
    settings = dict(QUANTISATION, weight_type=QuantType[QUANTISATION["weight_type"]])
    quantize_dynamic(model, str(out_path), nodes_to_exclude=kept, **settings)
    return {"kept_fp32": kept, "smoothed_matmuls": len(smoothed.matmuls)}


def session(path: Path, threads: int = 2) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def runner(path: Path, spec: ModelSpec, threads: int = 2) -> Any:
    """The model at ``path`` as a function of feeds (what the checks call)."""
    sess = session(path, threads)

    def run(feeds: Feeds) -> np.ndarray:
        inputs = {name: feeds[name] for name in spec.input_names}
        out: np.ndarray = sess.run([spec.output_name], inputs)[0]
        return out

    return run
