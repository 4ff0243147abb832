"""nncf_quantize on a tiny BERT (exported by torch_export, converted by openvino_convert) with a
small random-token calibration set: FakeQuantize nodes, closeness to FP32, ignored scopes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import pytest
from openvino_models import TINY_BERT, export_tiny_bert, make_ctx, masked_cosine, run_model, text_dataset

from engine.core import ModelArtifact, PassError
from engine.core.data import Dataset
from passes.openvino._ir import quantized_op_names
from passes.openvino.convert import OpenVinoConvert
from passes.openvino.nncf_quantize import NncfQuantize
from targets.openvino import OpenVinoTarget, model_precision_hint

CALIBRATION = text_dataset(16, seed=0)
CHECK = text_dataset(8, seed=1)
QUERY = "/model/encoder/layer.0/attention/self/query/MatMul"


def quantize(model: ModelArtifact, root: Path, data: Dataset = CALIBRATION, **options: object):
    config = NncfQuantize.Config(**{"calibration": "calibration", **options})
    return NncfQuantize(config)(model, make_ctx(root, {"calibration": data}))


def f32_target() -> OpenVinoTarget:
    return OpenVinoTarget(OpenVinoTarget.Config(id="ov", runtime="openvino", inference_precision_hint="f32"))


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def bert_onnx(tmp_path_factory: pytest.TempPathFactory) -> ModelArtifact:
    return export_tiny_bert(tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module")
def bert_ir(bert_onnx: ModelArtifact, tmp_path_factory: pytest.TempPathFactory) -> ModelArtifact:
    return OpenVinoConvert()(bert_onnx, make_ctx(tmp_path_factory.mktemp("ir"))).model


@pytest.fixture(scope="module")
def quantized(bert_ir: ModelArtifact, tmp_path_factory: pytest.TempPathFactory):
    return quantize(bert_ir, tmp_path_factory.mktemp("int8"), preset="mixed", model_type="transformer")


def test_quantized_model_has_fake_quantize_nodes_and_int8_weights(quantized) -> None:
    details = quantized.details
    assert details["fake_quantize_nodes"] > 0
    assert details["quantized_ops"]["MatMul"] >= 12  # the 12 weight MatMuls of two BERT layers
    assert details["weight_bytes_after"].get("i8", 0) > 0
    assert details["weight_bytes_after"]["total"] < 0.5 * details["weight_bytes_before"]["total"]
    ops = {op.get_type_name() for op in ov.Core().read_model(str(quantized.model.model_file)).get_ops()}
    assert "FakeQuantize" in ops


def test_quantized_outputs_stay_close_to_fp32(bert_ir: ModelArtifact, quantized) -> None:
    fp32, _ = run_model(f32_target(), bert_ir, CHECK)
    int8, _ = run_model(f32_target(), quantized.model, CHECK)
    cosine = masked_cosine(int8, fp32, CHECK.inputs["attention_mask"])
    assert cosine >= 0.999  # 0.99998 measured with nncf 3.4 / openvino 2026.4
    assert not np.array_equal(int8, fp32)  # something was quantized


def test_details_record_the_settings_and_the_capped_subset(quantized) -> None:
    details = quantized.details
    assert (details["preset"], details["model_type"], details["target_device"]) == ("mixed", "transformer", "ANY")
    assert details["subset_size"] == 16
    assert details["calibration_samples"] == 16
    assert quantized.notes == ["subset_size 300 is more than the 16 calibration samples: calibrated on all 16"]


def test_subset_size_within_the_data_is_used_without_a_note(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    result = quantize(bert_ir, tmp_path, subset_size=8, model_type="transformer")
    assert result.details["subset_size"] == 8
    assert result.notes == []


def test_quantizing_twice_gives_the_same_digest(bert_ir: ModelArtifact, quantized, tmp_path: Path) -> None:
    again = quantize(bert_ir, tmp_path, preset="mixed", model_type="transformer")
    assert again.model.digest == quantized.model.digest


def test_ignored_scope_names_stay_in_float(bert_ir: ModelArtifact, quantized, tmp_path: Path) -> None:
    before = quantized_op_names(ov.Core().read_model(str(quantized.model.model_file)))
    assert QUERY in before
    result = quantize(bert_ir, tmp_path, model_type="transformer", ignored_scope={"names": [QUERY]})
    after = quantized_op_names(ov.Core().read_model(str(result.model.model_file)))
    assert QUERY not in after
    assert set(after) == set(before) - {QUERY}
    assert result.details["ignored_scope"]["names"] == [QUERY]


def test_ignored_scope_patterns_and_types(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    by_pattern = quantize(bert_ir, tmp_path / "p", model_type="transformer", ignored_scope={"patterns": [".*layer\\.1/.*"]})
    names = quantized_op_names(ov.Core().read_model(str(by_pattern.model.model_file)))
    assert names and not any("layer.1/" in name for name in names)
    by_type = quantize(bert_ir, tmp_path / "t", ignored_scope={"types": ["MatMul"]})
    embeddings = (TINY_BERT["vocab_size"] + TINY_BERT["max_position_embeddings"] + 2) * TINY_BERT["hidden_size"]
    assert by_type.details["weight_bytes_after"]["i8"] == embeddings  # only the embedding tables (Gather) are INT8


def test_unknown_ignored_name_fails_unless_validation_is_off(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    with pytest.raises(PassError, match="no_such_node"):
        quantize(bert_ir, tmp_path / "a", ignored_scope={"names": ["no_such_node"]})
    result = quantize(bert_ir, tmp_path / "b", ignored_scope={"names": ["no_such_node"], "validate": False})
    assert result.details["fake_quantize_nodes"] > 0


def test_onnx_input_is_quantized_to_openvino_ir(bert_onnx: ModelArtifact, tmp_path: Path) -> None:
    result = quantize(bert_onnx, tmp_path, model_type="transformer")
    assert result.model.format == "openvino"
    assert result.details["source_format"] == "onnx"
    assert result.details["fake_quantize_nodes"] > 0
    assert result.details["inference_precision_hint"] is None


def test_the_input_precision_hint_is_kept(bert_onnx: ModelArtifact, tmp_path: Path) -> None:
    bf16_ir = OpenVinoConvert(OpenVinoConvert.Config(inference_precision_hint="bf16"))(bert_onnx, make_ctx(tmp_path / "ir")).model
    result = quantize(bf16_ir, tmp_path / "q", model_type="transformer")
    assert model_precision_hint(ov.Core().read_model(str(result.model.model_file))) == "bf16"
    assert result.details["inference_precision_hint"] == "bf16"


def test_a_dataset_without_a_model_input_is_a_pass_error(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    data = text_dataset(4, token_types=False)
    with pytest.raises(PassError, match=r"dataset 'calibration' lacks input\(s\) token_type_ids"):
        quantize(bert_ir, tmp_path, data=data)


def test_a_sample_shape_the_static_model_cannot_take_is_a_pass_error(bert_onnx: ModelArtifact, tmp_path: Path) -> None:
    shapes = {name: [1, 32] for name in ("input_ids", "attention_mask", "token_type_ids")}
    static = OpenVinoConvert(OpenVinoConvert.Config(input_shapes=shapes))(bert_onnx, make_ctx(tmp_path / "ir")).model
    with pytest.raises(PassError, match=r"shape \[1, 16\] per sample, but the model's input is \[1, 32\]"):
        quantize(static, tmp_path / "q")


def test_the_calibration_option_is_required() -> None:
    with pytest.raises(ValueError, match="calibration"):
        NncfQuantize.Config()


def test_int32_token_ids_are_cast_to_the_model_input_type(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    data = Dataset(inputs={name: array.astype(np.int32) for name, array in CALIBRATION.inputs.items()})
    result = quantize(bert_ir, tmp_path, data=data, subset_size=8, model_type="transformer")
    assert result.details["fake_quantize_nodes"] > 0


def test_smooth_quant_alpha_reaches_nncf(bert_ir: ModelArtifact, quantized, tmp_path: Path) -> None:
    """SmoothQuant scales the activations of the MatMuls it smooths: with it off (-1) NNCF inserts
    no smoothing Multiply; two alphas give two different models, each recorded in the details."""

    def smoothing(result) -> int:
        model = ov.Core().read_model(str(result.model.model_file))
        return sum(1 for op in model.get_ops() if "smooth_quant" in op.get_friendly_name())

    off = quantize(bert_ir, tmp_path / "off", preset="mixed", model_type="transformer", smooth_quant_alpha=-1)
    low = quantize(bert_ir, tmp_path / "low", preset="mixed", model_type="transformer", smooth_quant_alpha=0.3)
    assert smoothing(off) == 0
    assert smoothing(low) > 0 and smoothing(quantized) > 0  # NNCF's default (0.95) smooths too
    assert low.details["smooth_quant_alpha"] == 0.3 and quantized.details["smooth_quant_alpha"] is None
    assert low.model.digest != quantized.model.digest


def test_smooth_quant_alpha_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="smooth_quant_alpha"):
        NncfQuantize.Config(calibration="calibration", smooth_quant_alpha=1.5)
