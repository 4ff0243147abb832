"""Static QDQ INT8 of an attention whose mask is added as a huge negative fill (transformers' eager
attention: (1 - mask) * finfo(float32).min): quantized with the rest, the fill's range (scale
2.7e36 at int8) rounds every score to 0, attention turns uniform, and an unfused MiniLM export
kept cosine 0.36 to FP32. The pass leaves the nodes around such tensors in float and says so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper
from test_ort_quantize_static import _graph_model, _infer, _relative_error, _static

from engine.core.data import Dataset

FILL = float(np.finfo(np.float32).min)


def _masked_attention(seed: int = 7) -> onnx.ModelProto:
    """x[b,6,16], mask[b,6] → q k v projections → q @ k^T * 0.25 + (1 - mask) * FILL → Softmax → @ v → y[b,6,16]."""
    rng = np.random.default_rng(seed)
    weights = {name: (rng.standard_normal((16, 16)) * 0.4).astype(np.float32) for name in ("Wq", "Wk", "Wv")}
    weights |= {
        "scale": np.array(0.25, np.float32),
        "one": np.array(1.0, np.float32),
        "fill": np.array(FILL, np.float32),
        "axis": np.array([1], np.int64),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "Wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["x", "Wk"], ["k"], name="k_proj"),
        helper.make_node("MatMul", ["x", "Wv"], ["v"], name="v_proj"),
        helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["raw"], name="scores"),
        helper.make_node("Mul", ["raw", "scale"], ["scores"], name="scale"),
        helper.make_node("Sub", ["one", "mask"], ["inverted"], name="invert"),
        helper.make_node("Mul", ["inverted", "fill"], ["filled"], name="fill_mask"),
        helper.make_node("Unsqueeze", ["filled", "axis"], ["extended"], name="extend"),
        helper.make_node("Add", ["scores", "extended"], ["masked"], name="mask_add"),
        helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["y"], name="context"),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6, 16]),
        helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", 6]),
    ]
    return _graph_model(nodes, weights, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 6, 16])])


def _feeds(samples: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((samples, 6), np.float32)
    for row, padded in enumerate(rng.integers(0, 3, samples)):
        mask[row, 6 - padded :] = 0.0  # the last positions are padding
    return {"x": rng.standard_normal((samples, 6, 16)).astype(np.float32), "mask": mask}


def test_a_mask_fill_and_the_scores_it_joins_stay_in_float(tmp_path: Path) -> None:
    source, result = _static(
        tmp_path,
        _masked_attention(),
        Dataset(inputs=_feeds(64, 1)),
        activation_type="qint8",
        symmetric_activation=True,
        per_channel=True,
        calibration_batch_size=8,
    )
    unquantizable = result.details["calibration"]["unquantizable"]
    assert set(unquantizable["tensors"]) == {"filled", "extended", "masked"}
    assert {"fill_mask", "extend", "mask_add", "softmax"} <= set(unquantizable["nodes"])
    assert any("left in float" in note and "attention mask" in note for note in result.notes)
    feeds = _feeds(16, 2)
    error = _relative_error(_infer(source.model_file, feeds), _infer(result.model.model_file, feeds))
    assert error < 0.1, error  # quantized with the rest, the scores all round to 0: error ~0.5
    # the projections are still quantized
    graph = onnx.load(str(result.model.model_file)).graph
    assert sum(node.op_type == "QuantizeLinear" for node in graph.node) >= 3


def _residual_layer_norm(seed: int = 3) -> onnx.ModelProto:
    """a[b,6,16] → h = a @ W + b; the residual stream x[b,6,16]: r = x + h → LayerNormalization(r) → y[b,6,16]."""
    rng = np.random.default_rng(seed)
    weights = {
        "W": (rng.standard_normal((16, 16)) * 0.3).astype(np.float32),
        "b": (rng.standard_normal(16) * 0.1).astype(np.float32),
        "gamma": np.ones(16, np.float32),
        "beta": np.zeros(16, np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["a", "W"], ["h"], name="dense"),
        helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
        helper.make_node("Add", ["x", "hb"], ["r"], name="residual"),
        helper.make_node("LayerNormalization", ["r", "gamma", "beta"], ["y"], name="norm", axis=-1),
    ]
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 6, 16]) for name in ("a", "x")]
    return _graph_model(nodes, weights, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 6, 16])])


def _outliers(samples: int, seed: int) -> dict[str, np.ndarray]:
    """A residual stream with one outlier channel (x100), as BERT's hidden states have."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, 6, 16)).astype(np.float32)
    x[..., 3] *= 100.0
    return {"a": rng.standard_normal((samples, 6, 16)).astype(np.float32), "x": x}


def test_the_residual_add_and_the_layer_norm_it_feeds_stay_in_float(tmp_path: Path) -> None:
    source, result = _static(
        tmp_path, _residual_layer_norm(), Dataset(inputs=_outliers(64, 1)), activation_type="qint8", symmetric_activation=True
    )
    assert result.details["calibration"]["unquantizable"]["residual"] == ["norm", "residual"]
    assert any("residual Adds" in note for note in result.notes)
    feeds = _outliers(16, 2)
    error = _relative_error(_infer(source.model_file, feeds), _infer(result.model.model_file, feeds))
    assert error < 0.05, error
    quantized = {node.input[0] for node in onnx.load(str(result.model.model_file)).graph.node if node.op_type == "QuantizeLinear"}
    assert "r" not in quantized and "a" in quantized  # the residual sum stays float, the dense layer takes int8
