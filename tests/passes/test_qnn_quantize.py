"""16-bit static QDQ: ort_quantize's quint16 / qint16 types and qnn_quantize (onnxruntime's QNN
rules), run for real on small graphs built here; every output also runs on the CPU provider."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from pydantic import ValidationError

from engine.core import ModelArtifact, PassResult
from passes.quantize.ort_quantize import OrtQuantize
from passes.quantize.qnn_quantize import QnnQuantize
from tests.passes.test_ort_quantize_static import X, _artifact, _calibration_set, _context, _convnet, _infer, _mlp, _relative_error

#: the Sigmoid's output in _convnet("Sigmoid")
SIGMOID_OUT = "r"


def _run(
    pass_cls: type[OrtQuantize], tmp_path: Path, source: ModelArtifact, tag: str, shape: tuple[int, ...] = (64,), **config
) -> PassResult:
    config.setdefault("calibration_batch_size", 32)
    if pass_cls is OrtQuantize:
        config.setdefault("mode", "static")
    cfg = pass_cls.Config(calibration="calib", **config)
    return pass_cls(cfg)(source, _context(tmp_path / tag, _calibration_set(64, shape=shape), tmp_path / "cache"))


def _initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _quantize_params(model: onnx.ModelProto, op_type: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For each ``op_type`` node (QuantizeLinear / DequantizeLinear): its input -> (scale, zero point)."""
    inits = _initializers(model)
    return {n.input[0]: (inits[n.input[1]], inits[n.input[2]]) for n in model.graph.node if n.op_type == op_type}


# ---------------------------------------------------------------- ort_quantize, 16-bit activations


def test_uint16_activations_give_uint16_zero_points_and_run_on_the_cpu(tmp_path: Path) -> None:
    source = _artifact(tmp_path / "in", _mlp())
    result = _run(OrtQuantize, tmp_path, source, "a16", activation_type="quint16", per_channel=True)
    model = onnx.load(str(result.model.model_file))
    quantize = _quantize_params(model, "QuantizeLinear")
    assert quantize and all(zp.dtype == np.uint16 for _, zp in quantize.values())
    inits = _initializers(model)
    weights = [inits[n.input[0]] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    assert {w.dtype for w in weights if w.ndim == 2} == {np.dtype(np.int8)}  # weight_type stays qint8 (biases are int32)
    assert result.details["activation_type"] == "quint16"
    assert np.isfinite(_infer(result.model.model_file, {"x": X})).all()


def test_16bit_activations_are_closer_to_float_than_8bit(tmp_path: Path) -> None:
    # Per-channel qint8 weights in both, 64 calibration samples. Measured on this MLP: relative L2
    # error 3.23 % with 8-bit activations, 2.98 % with quint16 or qint16: the weights' 8 bits
    # dominate what is left, so the margin is small but the same on every run (the pass is deterministic).
    source = _artifact(tmp_path / "in", _mlp())
    reference = _infer(source.model_file, {"x": X})
    errors = {
        bits: _relative_error(
            reference, _infer(_run(OrtQuantize, tmp_path, source, bits, activation_type=bits, per_channel=True).model.model_file, {"x": X})
        )
        for bits in ("quint8", "quint16", "qint16")
    }
    assert errors["quint16"] < errors["quint8"]
    assert errors["qint16"] < errors["quint8"]


def test_16bit_types_with_qoperator_or_dynamic_mode_are_rejected() -> None:
    with pytest.raises(ValidationError, match="need quant_format QDQ"):
        OrtQuantize.Config(mode="static", calibration="c", activation_type="quint16", quant_format="QOperator")
    with pytest.raises(ValidationError, match="static \\(QDQ\\) only"):
        OrtQuantize.Config(weight_type="qint16")


def test_8bit_configs_dump_as_before() -> None:
    """The new types add no field: an ort_quantize config's JSON (and so its job key) is unchanged."""
    dumped = OrtQuantize.Config(mode="static", calibration="c").model_dump()
    assert "op_types_to_exclude" not in dumped and "init_overrides" not in dumped
    assert dumped["activation_type"] == "quint8"


# ---------------------------------------------------------------- qnn_quantize


def test_qnn_defaults_are_a16w8_qdq() -> None:
    cfg = QnnQuantize.Config(calibration="c")
    assert (cfg.mode, cfg.quant_format, cfg.activation_type, cfg.weight_type) == ("static", "QDQ", "quint16", "quint8")
    assert QnnQuantize.Config(mode="static", calibration="c").activation_type == "quint16"  # not ort_quantize's quint8 default


def test_qnn_rules_fix_sigmoid_output_and_keep_matmul_weights_per_tensor(tmp_path: Path) -> None:
    """What get_qnn_qdq_config requires for QNN's HTP: a 16-bit Sigmoid's output quantized with
    scale 1/65536 and zero point 0 whatever the calibration saw; with per_channel, Conv weights per
    channel but MatMul weights per tensor (QNN has no per-channel MatMul); weights uint8."""
    source = _artifact(tmp_path / "in", _convnet("Sigmoid", seed=7))
    result = _run(QnnQuantize, tmp_path, source, "qnn", shape=(3, 8, 8), per_channel=True, preprocess=False)
    model = onnx.load(str(result.model.model_file))
    quantize = _quantize_params(model, "QuantizeLinear")
    scale, zero_point = quantize[SIGMOID_OUT]
    assert zero_point.dtype == np.uint16 and int(zero_point) == 0
    assert float(scale) == pytest.approx(1.0 / 65536.0)
    assert all(zp.dtype == np.uint16 for _, zp in quantize.values())
    dequantize = _quantize_params(model, "DequantizeLinear")
    conv_scale, conv_zp = dequantize["Wc_quantized"]
    assert conv_scale.shape == (8,) and conv_zp.dtype == np.uint8
    fc_scale, fc_zp = dequantize["Wf_quantized"]
    assert fc_scale.shape == () and fc_zp.dtype == np.uint8
    assert "Wf" in result.details["calibration"]["qnn_overrides"] and SIGMOID_OUT in result.details["calibration"]["qnn_overrides"]
    assert {"Conv", "Sigmoid", "MatMul"} <= set(result.details["op_types_to_quantize"])
    images = np.random.default_rng(3).standard_normal((4, 3, 8, 8)).astype(np.float32)
    assert _relative_error(_infer(source.model_file, {"x": images}), _infer(result.model.model_file, {"x": images})) < 0.05


def test_qnn_op_types_to_exclude_leaves_that_op_in_float(tmp_path: Path) -> None:
    source = _artifact(tmp_path / "in", _convnet("Sigmoid", seed=7))
    result = _run(QnnQuantize, tmp_path, source, "excl", shape=(3, 8, 8), op_types_to_exclude=["Sigmoid"], preprocess=False)
    assert "Sigmoid" not in result.details["op_types_to_quantize"]
    assert SIGMOID_OUT not in result.details["calibration"]["qnn_overrides"]  # no QNN Sigmoid rule applied
    model = onnx.load(str(result.model.model_file))
    scale, _ = _quantize_params(model, "QuantizeLinear")[SIGMOID_OUT]  # quantized as the pool's input, from its calibrated range
    assert float(scale) != pytest.approx(1.0 / 65536.0)


def test_qnn_init_overrides_put_one_tensor_at_8_bits(tmp_path: Path) -> None:
    source = _artifact(tmp_path / "in", _convnet("Sigmoid", seed=7))
    overrides = {"p": [{"quant_type": "quint8"}]}
    result = _run(QnnQuantize, tmp_path, source, "mixed", shape=(3, 8, 8), init_overrides=overrides, preprocess=False)
    model = onnx.load(str(result.model.model_file))
    zero_points = {name: zp.dtype for name, (_, zp) in _quantize_params(model, "QuantizeLinear").items()}
    assert np.uint8 in zero_points.values() and np.uint16 in zero_points.values()
    images = np.random.default_rng(3).standard_normal((4, 3, 8, 8)).astype(np.float32)
    assert np.isfinite(_infer(result.model.model_file, {"x": images})).all()


def test_qnn_config_rejects_what_it_cannot_do() -> None:
    with pytest.raises(ValidationError):
        QnnQuantize.Config(calibration="c", quant_format="QOperator")
    with pytest.raises(ValidationError, match="fuse_layernorm"):
        QnnQuantize.Config(calibration="c", fuse_layernorm=True)
    with pytest.raises(ValidationError, match="unknown quant_type"):
        QnnQuantize.Config(calibration="c", init_overrides={"t": [{"quant_type": "uint16"}]})
