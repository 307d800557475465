"""SmoothQuant's graph surgery (models/smoothing.py) on a small ONNX graph built here, with what
MiniLM has: a LayerNorm whose output two MatMuls read (as query, key and value read one) and a
residual Add reads too, a ReLU whose output a MatMul reads (as the FFN's down-projection reads
GELU's), and a MatMul reading a graph input directly."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from models import smoothing

CHANNELS, HIDDEN, SIDE = 8, 16, 4
OUTPUTS = ["res", "side", "direct"]


def toy_model(outlier: float = 30.0, seed: int = 0, shared_weight: bool = False) -> onnx.ModelProto:
    """``outlier``: the LayerNorm's gain on channel 0 (the others' is 1). ``shared_weight``: the
    direct MatMul reads the side MatMul's weight."""
    rng = np.random.default_rng(seed)

    def weight(name: str, rows: int, cols: int):
        return numpy_helper.from_array(rng.normal(size=(rows, cols)).astype(np.float32), name)

    gamma = np.ones(CHANNELS, np.float32)
    gamma[0] = outlier
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], name="ln", axis=-1),
        helper.make_node("MatMul", ["ln", "w_up"], ["up"], name="up"),
        helper.make_node("MatMul", ["ln", "w_side"], ["side"], name="side"),
        helper.make_node("Relu", ["up"], ["act"], name="relu"),
        helper.make_node("MatMul", ["act", "w_down"], ["y"], name="down"),
        helper.make_node("Add", ["ln", "y"], ["res"], name="residual"),
        helper.make_node(
            "MatMul", ["x", "w_side" if shared_weight else "w_direct"], ["direct"], name="direct"
        ),
    ]
    shapes = {"res": CHANNELS, "side": SIDE, "direct": SIDE}
    graph = helper.make_graph(
        nodes,
        "toy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", CHANNELS])],
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", "seq", size])
            for name, size in shapes.items()
        ],
        [
            numpy_helper.from_array(gamma, "gamma"),
            numpy_helper.from_array(rng.normal(size=CHANNELS).astype(np.float32), "beta"),
            weight("w_up", CHANNELS, HIDDEN),
            weight("w_side", CHANNELS, SIDE),
            weight("w_down", HIDDEN, CHANNELS),
            weight("w_direct", CHANNELS, SIDE),
        ],
    )
    # IR version 10: what this ONNX Runtime reads (onnx writes its own newest by default).
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def batches(count: int, seed: int, padding: float | None = None) -> list[dict[str, np.ndarray]]:
    """Feeds of 4 rows x 6 positions; the last two positions of each row are padding (mask 0),
    filled with ``padding`` when given."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        x = rng.normal(size=(4, 6, CHANNELS)).astype(np.float32)
        mask = np.ones((4, 6), np.int64)
        mask[:, 4:] = 0
        if padding is not None:
            x[:, 4:] = padding
        out.append({"x": x, "attention_mask": mask})
    return out


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(OUTPUTS, {"x": feeds["x"]})


def weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def test_the_smoothed_graph_computes_what_it_did() -> None:
    original, model = toy_model(), toy_model()
    done = smoothing.smooth(model, batches(4, seed=1), lambda name: 0.5)
    onnx.checker.check_model(model)  # among others: the nodes are still in topological order
    assert done.inputs == ["ln", "act", "x"]
    assert done.matmuls == ["up", "side", "down", "direct"]
    muls = {n.input[0]: n.output[0] for n in model.graph.node if n.op_type == "Mul"}
    assert muls == {"x": "x/smoothed", "ln": "ln/smoothed", "act": "act/smoothed"}
    residual = next(n for n in model.graph.node if n.name == "residual")
    assert residual.input[0] == "ln"  # the residual path reads the tensor as it was
    feeds = batches(1, seed=2)[0]  # data the calibration never saw
    for before, after in zip(run(original, feeds), run(model, feeds), strict=True):
        np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4)


def real_maxima(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.abs(values[mask.astype(bool)]).max(axis=0)


@pytest.mark.parametrize("alpha", [0.5, 0.6])
def test_the_scales_split_each_channel_range_by_alpha(alpha: float) -> None:
    """s_k = max|X_k|^a / max|W_k|^(1-a) leaves, in channel k, max|X_k / s_k| = (max|X_k| *
    max|W_k|)^(1-a) and max|W_k * s_k| = (max|X_k| * max|W_k|)^a: at a = 0.5 both the same. The
    maxima are computed here with NumPy over the real positions only: the padding's huge values,
    which the direct MatMul reads as they are, must not count."""
    original, model = toy_model(), toy_model()
    calibration = batches(4, seed=1, padding=1e4)
    smoothing.smooth(model, calibration, lambda name: alpha)
    before, after = weights(original), weights(model)
    x = np.concatenate([b["x"] for b in calibration])
    mask = np.concatenate([b["attention_mask"] for b in calibration])
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    ln = (x - mean) / np.sqrt(var + 1e-5) * before["gamma"] + before["beta"]
    act = np.maximum(ln @ before["w_up"], 0)
    groups = {  # input -> (its values, the weights reading it)
        "x": (x, ["w_direct"]),
        "ln": (ln, ["w_up", "w_side"]),
        "act": (act, ["w_down"]),
    }
    seen = smoothing.channel_maxima(model, [f"{name}/smoothed" for name in groups], calibration)
    for name, (values, read_by) in groups.items():
        product = real_maxima(values, mask) * np.max(
            [np.abs(before[w]).max(axis=1) for w in read_by], axis=0
        )
        smoothed_weights = np.max([np.abs(after[w]).max(axis=1) for w in read_by], axis=0)
        np.testing.assert_allclose(smoothed_weights, product**alpha, rtol=1e-3)
        np.testing.assert_allclose(seen[f"{name}/smoothed"], product ** (1 - alpha), rtol=1e-3)


def test_alpha_is_read_per_group_and_skipped_matmuls_are_left_alone() -> None:
    model, original = toy_model(), weights(toy_model())
    asked: list[str] = []

    def alpha(name: str) -> float:
        asked.append(name)
        return 0.5

    done = smoothing.smooth(model, batches(2, seed=1), alpha, skip=lambda name: name == "down")
    assert asked == ["up", "direct"]  # once per input, named by its first MatMul
    assert done.matmuls == ["up", "side", "direct"]
    down = next(n for n in model.graph.node if n.name == "down")
    assert down.input[0] == "act"
    np.testing.assert_array_equal(weights(model)["w_down"], original["w_down"])
    assert not np.array_equal(weights(model)["w_up"], original["w_up"])


def test_a_weight_another_node_reads_is_refused() -> None:
    with pytest.raises(ValueError, match="'w_side' of 'side' is read by 2 nodes"):
        smoothing.smooth(toy_model(shared_weight=True), batches(1, seed=1), lambda name: 0.5)


def test_smoothing_shrinks_the_int8_error_an_outlier_channel_causes(tmp_path) -> None:
    """What it is for: with one LayerNorm channel 30x the others, dynamic int8 quantises every
    channel of its output on the outlier's scale; smoothed first, the same quantisation errs under
    0.75x as much on both outputs that read it (about half as much, seen)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    feeds = batches(1, seed=2)[0]
    reference = run(toy_model(), feeds)[:2]
    errors = {}
    for smoothed in (False, True):
        model = toy_model()
        if smoothed:
            smoothing.smooth(model, batches(4, seed=1), lambda name: 0.5)
        quantize_dynamic(
            model,
            tmp_path / "int8.onnx",
            per_channel=True,
            reduce_range=True,
            weight_type=QuantType.QInt8,
        )
        got = run(onnx.load(tmp_path / "int8.onnx"), feeds)[:2]
        errors[smoothed] = [
            float(np.abs(g - r).mean()) for g, r in zip(got, reference, strict=True)
        ]
    for plain, smoothed in zip(errors[False], errors[True], strict=True):
        assert smoothed < 0.75 * plain, errors


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("/layer.3/output/dense/MatMul", 0.6),  # both match: the first wins
        ("/layer.3/attention/output/dense/MatMul", 0.9),
        ("/layer.3/attention/self/query/MatMul", 0.5),  # neither: the default
    ],
)
def test_by_pattern_takes_the_first_matching_expression(name: str, expected: float) -> None:
    alpha = smoothing.by_pattern(0.5, {r"layer\.\d+/output/dense/MatMul$": 0.6, "dense": 0.9})
    assert alpha(name) == expected
