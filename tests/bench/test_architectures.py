"""bench/architectures.py's harness without Optimum's environment: synthetic feeds from a real ONNX
model's signature (past key/values included), interleaved timing of two real onnxruntime sessions,
the choice of Kiln's INT8 candidate, the files a pass goes through, and a failed row's rendering."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from _architectures_table import markdown, notes  # noqa: E402
from _architectures_timing import Shapes, dimension, feeds, first_error_line, interleaved, runner, session, shapes_for  # noqa: E402
from architectures import Row, Side, best_int8, timed_files  # noqa: E402


def _decoder_with_past(path: Path) -> Path:
    """A tiny decoder-shaped graph: ids, a mask over past + new positions, position ids, one past key."""
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "past_sequence_length + sequence_length"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, ["batch_size", 2, "past_sequence_length", 4]),
    ]
    outputs = [
        helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("mask_sum", TensorProto.INT64, None),
        helper.make_tensor_value_info("ids", TensorProto.INT64, None),
    ]
    nodes = [
        helper.make_node("Concat", ["past_key_values.0.key", "past_key_values.0.key"], ["present.0.key"], axis=2),
        helper.make_node("ReduceSum", ["attention_mask"], ["mask_sum"], keepdims=0),
        helper.make_node("Add", ["input_ids", "position_ids"], ["ids"]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "decoder", inputs, outputs), opset_imports=[helper.make_opsetid("", 17)], ir_version=8
    )
    onnx.save(model, path)
    return path


def _matmul(path: Path, size: int = 64) -> Path:
    """x [batch, sequence, size] @ W: a graph dynamic INT8 quantizes."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [size, size], np.random.default_rng(0).standard_normal(size * size).tolist())
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch_size", "sequence_length", size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_feeds_from_a_signature_with_past(tmp_path: Path) -> None:
    opened = session(_decoder_with_past(tmp_path / "decoder.onnx"), threads=1)
    feed = feeds(opened.get_inputs(), Shapes(sequence=8, past=5, vocab=50))
    assert feed["input_ids"].shape == (1, 8) and feed["input_ids"].min() >= 1 and feed["input_ids"].max() < 50
    assert feed["attention_mask"].shape == (1, 13) and (feed["attention_mask"] == 1).all()
    assert feed["past_key_values.0.key"].shape == (1, 2, 5, 4) and feed["past_key_values.0.key"].dtype == np.float32
    assert feed["position_ids"].tolist() == [list(range(5, 13))]  # the new tokens follow the past ones
    present, mask_sum, _ = opened.run(None, feed)
    assert present.shape == (1, 2, 10, 4) and int(mask_sum) == 13


def test_dimensions_by_name_and_whisper_sizes() -> None:
    shapes = shapes_for({"model_type": "whisper", "max_source_positions": 24, "num_mel_bins": 16, "vocab_size": 128}, sequence=4, past=3)
    assert (shapes.mels, shapes.frames, shapes.encoder) == (16, 48, 24)
    assert dimension("past_decoder_sequence_length + 1", shapes) == 4
    assert dimension("encoder_sequence_length_out", shapes) == 24
    assert dimension("total_sequence_length", shapes) == 7
    assert dimension("kv_cache_dim", shapes_for({"hidden_size": 128, "num_attention_heads": 4, "head_dim": 16})) == 16
    assert shapes_for({"hidden_size": 128, "num_attention_heads": 4}).head == 32
    assert dimension("batch_size", shapes) == 1 and dimension("decoder_sequence_length", shapes) == 4
    convnext = {"model_type": "convnext", "image_size": 224}  # config.json's size is not the processor's
    assert shapes_for(convnext, processor={"size": {"height": 64, "width": 64}}).side == 64
    assert shapes_for(convnext).side == 224


def test_interleaved_timing_gives_a_ratio_with_an_interval(tmp_path: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp32 = _matmul(tmp_path / "fp32.onnx")
    int8 = tmp_path / "int8.onnx"
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    shapes = Shapes(sequence=16)
    result = interleaved(runner([fp32], shapes, 1), runner([int8], shapes, 1), rounds=4, runs=3, warmup=1)
    assert result["low"] <= result["speedup"] <= result["high"] and result["speedup"] > 0
    assert len(result["ratios"]) == 4 and result["fp32_ms"] > 0 and result["int8_ms"] > 0


def test_kiln_int8_candidate_and_the_files_of_a_pass() -> None:
    def candidate(name: str, speedup: float, **extra: object) -> dict[str, object]:
        return {"path": name, "state": "complete", "model_digest": name, "metrics": {"latency.speedup": speedup}, **extra}

    reference = candidate("export", 1.0, reference=True, chosen=True)
    slow, fast = candidate("slow", 0.9), candidate("fast", 1.2)
    assert best_int8([reference, slow, fast]) == fast  # the FP32 model was chosen: the fastest INT8 one
    assert best_int8([reference, {**slow, "chosen": True}, fast])["path"] == "slow"  # type: ignore[index]
    assert best_int8([reference, {**fast, "state": "failed"}]) is None
    files = [Path(f"{n}.onnx") for n in ("encoder_model", "decoder_model", "decoder_with_past_model", "decoder_model_merged")]
    assert [f.stem for f in timed_files(files)] == ["encoder_model", "decoder_model", "decoder_with_past_model"]
    assert timed_files([Path("decoder_model_merged.onnx")]) == [Path("decoder_model_merged.onnx")]


def test_a_failed_row_renders_with_its_error() -> None:
    trace = "Traceback (most recent call last):\n  File 'x.py', line 1\nValueError: Whisper expects 48 frames\n"
    assert first_error_line(trace) == "ValueError: Whisper expects 48 frames"
    failed = Side("optimum", exit_code=1, error=f"export: {first_error_line(trace)}")
    kiln = Side("kiln", export_ok=True, fp32_files=["model.onnx"], int8_ok=True, int8_files=["model.onnx"], exit_code=0)
    kiln.timing = {"fp32_ms": 2.0, "int8_ms": 1.0, "speedup": 2.0, "low": 1.8, "high": 2.2}
    row = Row("whisper", "automatic-speech-recognition", {"optimum": failed, "kiln": kiln})
    table = markdown([row])
    assert "| whisper | automatic-speech-recognition | optimum | FAILED (exit 1) | — | — | — | — | — |" in table
    assert "| kiln | ok | model | ok | 2.000 | 1.000 | 2.00x [1.80, 2.20] |" in table
    assert notes([row]) == ["whisper optimum: FAILED, exit 1: export: ValueError: Whisper expects 48 frames"]
