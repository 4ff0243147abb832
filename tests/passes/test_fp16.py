"""fp16 on small graphs built here: onnxruntime's converter converts, onnxruntime (CPU) runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.core import ModelArtifact, PassContext, PassError, PassResult
from passes.precision.fp16 import Fp16


def _mlp_softmax() -> onnx.ModelProto:
    """x[batch,64] -> MatMul(64x64) -> Add -> Relu -> MatMul(64x16) -> Softmax -> y[batch,16]."""
    rng = np.random.default_rng(0)
    weights = {
        "W1": (rng.standard_normal((64, 64)) * 0.1).astype(np.float32),
        "b1": (rng.standard_normal(64) * 0.1).astype(np.float32),
        "W2": (rng.standard_normal((64, 16)) * 0.1).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
        helper.make_node("Add", ["h", "b1"], ["h_biased"], name="add1"),
        helper.make_node("Relu", ["h_biased"], ["h_relu"], name="relu1"),
        helper.make_node("MatMul", ["h_relu", "W2"], ["logits"], name="mm2"),
        helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _contrib() -> onnx.ModelProto:
    """MatMul -> com.microsoft BiasGelu: a fused op onnx's own shape inference does not know."""
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("BiasGelu", ["h", "b"], ["y"], name="bias_gelu", domain="com.microsoft"),
    ]
    graph = helper.make_graph(
        nodes,
        "contrib",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])],
        [
            numpy_helper.from_array((rng.standard_normal((32, 32)) * 0.1).astype(np.float32), "W"),
            numpy_helper.from_array((rng.standard_normal(32) * 0.1).astype(np.float32), "b"),
        ],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _artifact(folder: Path, model: onnx.ModelProto) -> ModelArtifact:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    return ModelArtifact.from_folder("onnx", folder)


def _convert(root: Path, model: onnx.ModelProto, **config: object) -> PassResult:
    source = _artifact(root / "in", model)
    (root / "work").mkdir(parents=True)
    ctx = PassContext(step_id="fp16", workdir=root / "work", output_dir=root / "out")
    return Fp16(Fp16.Config(**config))(source, ctx)


def _run(model_file: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _ops(model_file: Path) -> list[str]:
    return [node.op_type for node in onnx.load(str(model_file)).graph.node]


def _relative_error(reference: np.ndarray, value: np.ndarray) -> float:
    return float(np.linalg.norm(value.astype(np.float32) - reference) / np.linalg.norm(reference))


X = np.random.default_rng(100).standard_normal((8, 64)).astype(np.float32)
#: float16 has a 10-bit mantissa (unit roundoff 4.9e-4); inputs, weights and each product round to
#: it and 64-term sums accumulate a few roundings: measured 1e-4 to 3e-4 here, allowed 3e-3
FP16_TOLERANCE = 3e-3


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the engine runs passes with cwd = workdir; tools drop files there


def test_weights_and_io_become_float16_by_default(tmp_path: Path) -> None:
    result = _convert(tmp_path, _mlp_softmax())
    model = onnx.load(str(result.model.model_file))
    assert {t.data_type for t in model.graph.initializer} == {TensorProto.FLOAT16}
    assert result.details["inputs"] == {"x": "float16"}
    assert result.details["outputs"] == {"y": "float16"}
    assert _ops(result.model.model_file) == ["MatMul", "Add", "Relu", "MatMul", "Softmax"]
    y = _run(result.model.model_file, X.astype(np.float16))
    assert y.dtype == np.float16
    assert _relative_error(_run(tmp_path / "in" / "model.onnx", X), y) < FP16_TOLERANCE


def test_initializer_bytes_halve(tmp_path: Path) -> None:
    details = _convert(tmp_path, _mlp_softmax()).details
    assert details["initializer_bytes_before"] == (64 * 64 + 64 + 64 * 16) * 4
    assert details["initializer_bytes_after"] == details["initializer_bytes_before"] // 2
    assert (details["float32_initializers_before"], details["float32_initializers_after"], details["float16_initializers_after"]) == (
        3,
        0,
        3,
    )


def test_keep_io_types_casts_at_the_edges_and_passes_checker(tmp_path: Path) -> None:
    result = _convert(tmp_path, _mlp_softmax(), keep_io_types=True)
    onnx.checker.check_model(str(result.model.model_file), full_check=True)  # the converter's casts are sorted into place
    ops = _ops(result.model.model_file)
    assert ops[0] == "Cast"
    assert ops[-1] == "Cast"
    assert result.details["inputs"] == {"x": "float32"}
    y = _run(result.model.model_file, X)
    assert y.dtype == np.float32
    assert _relative_error(_run(tmp_path / "in" / "model.onnx", X), y) < FP16_TOLERANCE


def test_blocked_op_type_stays_float32(tmp_path: Path) -> None:
    result = _convert(tmp_path, _mlp_softmax(), keep_io_types=True, op_block_list=["Softmax"])
    model = onnx.load(str(result.model.model_file))
    softmax = next(node for node in model.graph.node if node.op_type == "Softmax")
    producer = next(node for node in model.graph.node if softmax.input[0] in node.output)
    assert producer.op_type == "Cast"  # float16 logits cast back to float32 for the Softmax
    assert result.details["op_block_list"] == ["Softmax"]
    assert result.details["blocked_nodes_present"] == {"Softmax": 1}


def test_default_block_list_is_the_librarys_and_is_recorded(tmp_path: Path) -> None:
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

    assert _convert(tmp_path, _mlp_softmax()).details["op_block_list"] == list(DEFAULT_OP_BLOCK_LIST)


def test_blocked_node_stays_float32(tmp_path: Path) -> None:
    result = _convert(tmp_path, _mlp_softmax(), node_block_list=["mm2"])
    model = onnx.load(str(result.model.model_file))
    w2 = next(t for t in model.graph.initializer if t.name == "W2")
    assert w2.data_type == TensorProto.FLOAT
    assert _relative_error(_run(tmp_path / "in" / "model.onnx", X), _run(result.model.model_file, X.astype(np.float16))) < FP16_TOLERANCE


def test_unknown_blocked_node_is_a_pass_error(tmp_path: Path) -> None:
    with pytest.raises(PassError, match="node_block_list: the model has no node named matmul_2"):
        _convert(tmp_path, _mlp_softmax(), node_block_list=["matmul_2"])


def test_fused_contrib_ops_convert_with_symbolic_shape_inference(tmp_path: Path) -> None:
    result = _convert(tmp_path, _contrib(), keep_io_types=True)
    onnx.checker.check_model(str(result.model.model_file))
    x = np.random.default_rng(2).standard_normal((4, 32)).astype(np.float32)
    assert _relative_error(_run(tmp_path / "in" / "model.onnx", x), _run(result.model.model_file, x)) < FP16_TOLERANCE
    assert result.details["initializer_bytes_after"] == result.details["initializer_bytes_before"] // 2


def test_summary_and_notes_say_it_is_a_gpu_pass(tmp_path: Path) -> None:
    assert (
        "FP16 on ONNX Runtime's CPU provider gains nothing: it inserts casts back; measure it on CPU only to see what it costs"
        in Fp16.summary
    )
    assert any(note.startswith("FP16 is a GPU pass") for note in _convert(tmp_path, _mlp_softmax()).notes)


@pytest.mark.parametrize("keep_io_types", [False, True])
def test_same_input_and_config_give_the_same_bytes(tmp_path: Path, keep_io_types: bool) -> None:
    first = _convert(tmp_path / "a", _mlp_softmax(), keep_io_types=keep_io_types)
    second = _convert(tmp_path / "b", _mlp_softmax(), keep_io_types=keep_io_types)
    assert first.model.digest == second.model.digest
    assert first.model.model_file.read_bytes() == second.model.model_file.read_bytes()


def test_nothing_is_printed_and_cwd_stays_clean(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    _convert(tmp_path / "run", _contrib(), keep_io_types=True)
    captured = capfd.readouterr()
    assert (captured.out, captured.err) == ("", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert list((tmp_path / "run" / "work").iterdir()) == []


def test_a_genai_folder_stays_a_genai_folder_with_its_external_data_left_behind(tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()
    onnx.save_model(_mlp_softmax(), str(source / "model.onnx"), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    config = {"model": {"decoder": {"filename": "model.onnx"}, "type": "llama"}}
    (source / "genai_config.json").write_text(json.dumps(config))
    (source / "tokenizer.json").write_text("{}")
    (tmp_path / "work").mkdir()
    ctx = PassContext(step_id="fp16", workdir=tmp_path / "work", output_dir=tmp_path / "out")
    result = Fp16(Fp16.Config())(ModelArtifact.from_folder("genai", source), ctx)
    assert result.model.format == "genai"
    assert sorted(p.name for p in result.model.path.iterdir()) == ["genai_config.json", "model.onnx", "tokenizer.json"]
    assert json.loads((result.model.path / "genai_config.json").read_text()) == config
    assert _relative_error(_run(source / "model.onnx", X), _run(result.model.model_file, X.astype(np.float16))) < FP16_TOLERANCE
