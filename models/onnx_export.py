"""ONNX exports of MiniLM: fp32, ORT-optimised, and int8 (smoothed, then quantised) with an accuracy gate.

All three share the contract in ``serving.contracts.SENTENCE_EMBEDDING``: int64 ``input_ids``,
``attention_mask``, ``token_type_ids`` with dynamic batch and sequence axes, and
``sentence_embedding`` [batch, 384], mean-pooled and L2-normalised inside the graph.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from serving.contracts import SENTENCE_EMBEDDING
from serving.features import Feeds

OPSET = 17
DYNAMIC_AXES = {spec.name: {0: "batch", 1: "sequence"} for spec in SENTENCE_EMBEDDING.inputs} | {
    "sentence_embedding": {0: "batch"}
}
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
# outputs, whose outlier channels need more of the difficulty moved into the weights; the first
# layer's is kept in fp32. Chosen on the gate's sentences and checked on the load-test corpus
# (docs/decisions/0016-int8-smoothing.md). Calibration: prose of the corpus's 'train' partition.
FFN_DOWN = r"layer\.\d+/output/dense/MatMul$"
SMOOTHING: dict[str, Any] = {
    "alpha": 0.5,
    "alpha_by_node": {FFN_DOWN: 0.6},
    "calibration_sentences": 512,
}
FP32_NODES = r"layer\.0/output/dense/MatMul$"


def export_fp32(source_dir: Path, out_path: Path) -> None:
    import torch

    from models import torch_reference

    model = torch_reference.load(source_dir)
    dummy = tuple(torch.ones((2, 8), dtype=torch.int64) for _ in SENTENCE_EMBEDDING.inputs)
    # The TorchScript exporter writes one self-contained file; dynamo=True needs onnxscript and
    # writes external data.
    torch.onnx.export(
        model,
        dummy,
        str(out_path),
        input_names=SENTENCE_EMBEDDING.input_names,
        output_names=SENTENCE_EMBEDDING.output_names,
        dynamic_axes=DYNAMIC_AXES,
        opset_version=OPSET,
        dynamo=False,
    )


def optimise(fp32_path: Path, out_path: Path, num_heads: int, hidden_size: int) -> dict:
    """ORT's transformer optimiser: fuses attention, LayerNorm, GELU and bias adds."""
    from onnxruntime.transformers.optimizer import optimize_model

    optimised = optimize_model(
        str(fp32_path), model_type="bert", num_heads=num_heads, hidden_size=hidden_size, opt_level=1
    )
    optimised.save_model_to_file(str(out_path))
    return {k: int(v) for k, v in optimised.get_fused_operator_statistics().items() if v}


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


def session(path: Path, threads: int = 2):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def embed(sess, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return sess.run(["sentence_embedding"], feeds)[0]
