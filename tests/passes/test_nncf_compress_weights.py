"""nncf_compress_weights on a tiny BERT: INT8 and INT4 weights, group sizes, data-aware INT4."""

from __future__ import annotations

from pathlib import Path

import openvino as ov
import pytest
from openvino_models import TINY_BERT, export_tiny_bert, make_ctx, masked_cosine, run_model, text_dataset, tiny_bert_ir

from engine.core import ModelArtifact, PassError
from passes.openvino.nncf_compress_weights import NncfCompressWeights
from targets.openvino import OpenVinoTarget

CHECK = text_dataset(8, seed=1)


def compress(model: ModelArtifact, root: Path, **options: object):
    return NncfCompressWeights(NncfCompressWeights.Config(**options))(model, make_ctx(root, {"data": text_dataset(16)}))


def f32_target() -> OpenVinoTarget:
    return OpenVinoTarget(OpenVinoTarget.Config(id="ov", runtime="openvino", inference_precision_hint="f32"))


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def bert_ir(tmp_path_factory: pytest.TempPathFactory) -> ModelArtifact:
    return tiny_bert_ir(tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module")
def int8(bert_ir: ModelArtifact, tmp_path_factory: pytest.TempPathFactory):
    return compress(bert_ir, tmp_path_factory.mktemp("int8"))


def test_int8_shrinks_the_weights_and_keeps_activations_in_float(int8) -> None:
    details = int8.details
    before, after = details["weight_bytes_before"], details["weight_bytes_after"]
    assert after["total"] < 0.35 * before["total"]
    assert after["u8"] > 0.8 * before["f32"] / 4  # INT8_ASYM: unsigned 8-bit weights
    assert details["compressed_ops"] == {"Gather": 3, "MatMul": 12}  # embeddings + 12 linear layers
    assert (details["mode"], details["group_size"], details["data_aware"]) == ("INT8_ASYM", -1, False)


def test_int8_output_has_no_fake_quantize_nodes(int8) -> None:
    ops = {op.get_type_name() for op in ov.Core().read_model(str(int8.model.model_file)).get_ops()}
    assert "FakeQuantize" not in ops  # activations stay in float
    assert "Convert" in ops  # weights are decompressed at run time


def test_int8_weights_keep_outputs_close(bert_ir: ModelArtifact, int8) -> None:
    fp32, _ = run_model(f32_target(), bert_ir, CHECK)
    compressed, _ = run_model(f32_target(), int8.model, CHECK)
    assert masked_cosine(compressed, fp32, CHECK.inputs["attention_mask"]) >= 0.999


def test_compressing_twice_gives_the_same_digest(bert_ir: ModelArtifact, int8, tmp_path: Path) -> None:
    assert compress(bert_ir, tmp_path).model.digest == int8.model.digest


def test_int8_sym_writes_signed_weights_and_notes_ignored_options(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    result = compress(bert_ir, tmp_path, mode="INT8_SYM", group_size=32, ratio=0.5)
    assert result.details["weight_bytes_after"].get("i8", 0) > 0
    assert "u8" not in result.details["weight_bytes_after"]
    assert result.notes == ["INT8_SYM compresses every layer per output channel without data: ignored group_size, ratio"]


def test_int4_with_a_group_size_dividing_the_channels(bert_ir: ModelArtifact, int8, tmp_path: Path) -> None:
    result = compress(bert_ir, tmp_path, mode="INT4_SYM", group_size=16)
    after = result.details["weight_bytes_after"]
    assert after.get("i4", 0) > 0
    assert after["total"] < int8.details["weight_bytes_after"]["total"]
    assert result.details["group_size"] == 16


def test_default_int4_group_size_that_does_not_divide_the_channels_fails_or_adjusts(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    # hidden size 32: the default group size 128 does not divide it
    with pytest.raises(PassError, match="group size"):
        compress(bert_ir, tmp_path / "error", mode="INT4_SYM")
    adjusted = compress(bert_ir, tmp_path / "adjust", mode="INT4_SYM", group_size_fallback="adjust")
    assert adjusted.details["weight_bytes_after"].get("i4", 0) > 0
    assert adjusted.details["group_size"] == 128


def test_data_aware_int4_with_a_ratio_keeps_some_layers_in_int8(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    result = compress(bert_ir, tmp_path, mode="INT4_ASYM", group_size=16, ratio=0.5, dataset="data")
    after = result.details["weight_bytes_after"]
    assert after.get("u4", 0) > 0 and after.get("u8", 0) > 0
    assert result.details["data_aware"]
    assert result.details["bitwidth_table"] and "int4_asym" in result.details["bitwidth_table"]
    assert any("subset_size 128 is more than the 16" in note for note in result.notes)


def test_awq_without_a_dataset_is_a_pass_error(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    with pytest.raises(PassError, match="awq and scale_estimation need a dataset"):
        compress(bert_ir, tmp_path, mode="INT4_SYM", group_size=16, awq=True)


def test_ignored_scope_keeps_weights_in_float(bert_ir: ModelArtifact, int8, tmp_path: Path) -> None:
    result = compress(bert_ir, tmp_path, ignored_scope={"types": ["Gather"]})
    assert result.details["compressed_ops"] == {"MatMul": 12}
    rows = TINY_BERT["vocab_size"] + TINY_BERT["max_position_embeddings"] + 2  # word, position, token type
    # the three tables' INT8 weights and their per-row INT8 zero points are no longer there
    assert int8.details["weight_bytes_after"]["u8"] - result.details["weight_bytes_after"]["u8"] == rows * TINY_BERT["hidden_size"] + rows


def test_onnx_input_is_compressed_to_openvino_ir(tmp_path: Path) -> None:
    onnx_model = export_tiny_bert(tmp_path / "bert")
    result = compress(onnx_model, tmp_path / "int8")
    assert result.model.format == "openvino"
    assert result.details["source_format"] == "onnx"
    assert result.details["compressed_ops"]["MatMul"] == 12
