"""The NPU pipeline passes on small graphs built here: fixed_shape, nbits_to_qdq (on a model
int4_weights quantized, run by onnxruntime on the CPU), add_metadata. No mocks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.core import ModelArtifact, Pass, PassContext, PassError, PassResult
from passes.graph.fixed_shape import FixedShape, symbolic_dims

K, N = 128, 64


def _float(name: str, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _dynamic_model() -> onnx.ModelProto:
    """x [batch, sequence, K] -> MatMul(W) -> Relu -> y [batch, sequence, N]."""
    weight = (np.random.default_rng(0).standard_normal((K, N)) * 0.1).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="relu")]
    graph = helper.make_graph(
        nodes,
        "dynamic",
        [_float("x", ["batch", "sequence", K])],
        [_float("y", ["batch", "sequence", N])],
        [numpy_helper.from_array(weight, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _artifact(folder: Path, model: onnx.ModelProto) -> ModelArtifact:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    return ModelArtifact.from_folder("onnx", folder)


def _apply(root: Path, step: Pass, source: ModelArtifact, name: str = "out") -> PassResult:
    (root / f"{name}-work").mkdir(parents=True, exist_ok=True)
    ctx = PassContext(step_id=name, workdir=root / f"{name}-work", output_dir=root / name, input_model=source)
    return step(source, ctx)


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


# -- fixed_shape --------------------------------------------------------------------------------------
def test_fixed_shape_by_dim_param_leaves_no_symbolic_dim(tmp_path: Path) -> None:
    source = _artifact(tmp_path / "in", _dynamic_model())
    result = _apply(tmp_path, FixedShape(FixedShape.Config(dim_param=["batch", "sequence"], dim_value=[1, 16])), source)
    proto = onnx.load(str(result.model.model_file))
    assert symbolic_dims(onnx.shape_inference.infer_shapes(proto)) == {}
    assert result.details["inputs"] == {"x": [1, 16, K]}
    assert result.details["outputs"] == {"y": [1, 16, N]}
    assert result.details["symbolic_before"] == ["batch", "sequence"]
    assert result.details["symbolic_after"] == {}
    x = np.random.default_rng(1).standard_normal((1, 16, K)).astype(np.float32)
    assert ort.InferenceSession(str(result.model.model_file), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0].shape == (1, 16, N)


def test_fixed_shape_by_input_shape(tmp_path: Path) -> None:
    source = _artifact(tmp_path / "in", _dynamic_model())
    result = _apply(tmp_path, FixedShape(FixedShape.Config(input_name=["x"], input_shape=[[2, 8, K]], require_static=True)), source)
    assert result.details["outputs"] == {"y": [2, 8, N]}
    assert symbolic_dims(onnx.shape_inference.infer_shapes(onnx.load(str(result.model.model_file)))) == {}


def test_fixed_shape_reports_what_stays_symbolic_and_require_static_fails(tmp_path: Path) -> None:
    source = _artifact(tmp_path / "in", _dynamic_model())
    result = _apply(tmp_path, FixedShape(FixedShape.Config(dim_param=["batch"], dim_value=[1])), source)
    assert set(result.details["symbolic_after"]) == {"sequence"}
    assert "x" in result.details["symbolic_after"]["sequence"]
    with pytest.raises(PassError, match="require_static: dims stay symbolic after the fix: sequence"):
        _apply(tmp_path, FixedShape(FixedShape.Config(dim_param=["batch"], dim_value=[1], require_static=True)), source, "strict")


def test_fixed_shape_unknown_dim_or_input_is_a_clear_error(tmp_path: Path) -> None:
    source = _artifact(tmp_path / "in", _dynamic_model())
    with pytest.raises(PassError, match=r"no symbolic dim batch_size \(its symbolic dims: batch, sequence\)"):
        _apply(tmp_path, FixedShape(FixedShape.Config(dim_param=["batch_size"], dim_value=[1])), source, "a")
    with pytest.raises(PassError, match=r"no input input_ids \(its inputs: x\)"):
        _apply(tmp_path, FixedShape(FixedShape.Config(input_name=["input_ids"], input_shape=[[1, 8]])), source, "b")


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"dim_param": ["batch"]},
        {"dim_param": ["batch", "sequence"], "dim_value": [1]},
        {"dim_param": ["batch"], "dim_value": [1], "input_name": ["x"], "input_shape": [[1, 2, 3]]},
        {"input_name": ["x"], "input_shape": [[1, 0, 3]]},
    ],
)
def test_fixed_shape_options_are_checked_as_olive_checks_them(config: dict) -> None:
    with pytest.raises(ValueError):
        FixedShape.Config.model_validate(config)


def test_fixed_shape_writes_external_data_when_asked(tmp_path: Path) -> None:
    source = _artifact(tmp_path / "in", _dynamic_model())
    config = FixedShape.Config(dim_param=["batch"], dim_value=[1], save_as_external_data=True, external_data_name="weights.bin")
    result = _apply(tmp_path, FixedShape(config), source)
    assert (result.model.path / "weights.bin").stat().st_size == K * N * 4


# -- nbits_to_qdq ------------------------------------------------------------------------------------
def _two_matmuls(k: int = K) -> onnx.ModelProto:
    """x [batch, k] -> MatMul(W1: k x 64) -> Relu -> MatMul(W2: 64 x 32) -> y."""
    rng = np.random.default_rng(5)
    weights = [(rng.standard_normal((k, N)) * 0.1).astype(np.float32), (rng.standard_normal((N, 32)) * 0.1).astype(np.float32)]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="/layer/MatMul"),
        helper.make_node("Relu", ["h"], ["h_relu"], name="relu"),
        helper.make_node("MatMul", ["h_relu", "W2"], ["y"], name="/head/MatMul"),
    ]
    initializers = [numpy_helper.from_array(w, name) for w, name in zip(weights, ("W1", "W2"), strict=True)]
    graph = helper.make_graph(nodes, "two", [_float("x", ["batch", k])], [_float("y", ["batch", 32])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _int4(root: Path, model: onnx.ModelProto, **config: object) -> ModelArtifact:
    from passes.quantize.int4_weights import Int4Weights

    return _apply(root, Int4Weights(Int4Weights.Config(**config)), _artifact(root / "float", model), "int4").model


def _outputs(model_file: Path, x: np.ndarray, qdq: bool = False) -> np.ndarray:
    """The model's output on the CPU EP. onnxruntime fuses DequantizeLinear + MatMul back into
    MatMulNBits, by default with int8 activations (``session.qdq_matmulnbits_accuracy_level`` 4,
    about 1% off here): a QDQ model runs with that level at 1 (float), as the MatMulNBits model does."""
    options = ort.SessionOptions()
    if qdq:
        options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    return ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _unoptimized(model_file: Path, x: np.ndarray) -> np.ndarray:
    """The graph's own result: DequantizeLinear then MatMul, no fusion."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _op_types(model_file: Path) -> list[str]:
    return [node.op_type for node in onnx.load(str(model_file)).graph.node]


QDQ_CASES = [
    ({"is_symmetric": True}, {}),
    ({"is_symmetric": False}, {}),
    ({"is_symmetric": True}, {"use_int4": True}),
    ({"is_symmetric": False}, {"use_signed_int": True, "add_zero_point": True}),
    ({"is_symmetric": True, "block_size": 64}, {"use_transpose_op": True}),
    ({"is_symmetric": False, "block_size": 128}, {"use_transpose_op": True, "use_int4": True}),  # one block: per-axis
    ({"is_symmetric": True, "bits": 8}, {}),
]


@pytest.mark.parametrize(("quantize", "config"), QDQ_CASES)
def test_nbits_to_qdq_matches_matmul_nbits_on_cpu(tmp_path: Path, quantize: dict, config: dict) -> None:
    from passes.quantize.nbits_to_qdq import NbitsToQdq

    quantized = _int4(tmp_path, _two_matmuls(), **quantize)
    assert _op_types(quantized.model_file).count("MatMulNBits") == 2
    result = _apply(tmp_path, NbitsToQdq(NbitsToQdq.Config(**config)), quantized, "qdq")
    ops = _op_types(result.model.model_file)
    assert "MatMulNBits" not in ops
    assert ops.count("DequantizeLinear") == 2 and ops.count("MatMul") == 2
    assert result.details["converted"] == 2 and result.details["skipped"] == {}
    proto = onnx.load(str(result.model.model_file))
    assert {entry.domain for entry in proto.opset_import} == {""}
    onnx.checker.check_model(proto, full_check=True)
    x = np.random.default_rng(100).standard_normal((16, K)).astype(np.float32)
    reference = _outputs(quantized.model_file, x)
    np.testing.assert_allclose(_unoptimized(result.model.model_file, x), reference, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(_outputs(result.model.model_file, x, qdq=True), reference, rtol=1e-4, atol=1e-5)


def test_nbits_to_qdq_zero_points_and_names_follow_olive(tmp_path: Path) -> None:
    from passes.quantize.nbits_to_qdq import NbitsToQdq

    quantized = _int4(tmp_path, _two_matmuls(), is_symmetric=True)
    result = _apply(tmp_path, NbitsToQdq(NbitsToQdq.Config(use_int4=True)), quantized, "signed")
    proto = onnx.load(str(result.model.model_file))
    dq = [node for node in proto.graph.node if node.op_type == "DequantizeLinear"]
    assert [len(node.input) for node in dq] == [2, 2]  # symmetric int4: DQ's default zero point 0
    initializers = {tensor.name: tensor for tensor in proto.graph.initializer}
    weight = initializers[dq[0].input[0]]
    assert weight.data_type == TensorProto.INT4 and list(weight.dims) == [K, N]
    assert list(initializers[dq[0].input[1]].dims) == [K // 32, N]
    unsigned = _apply(tmp_path, NbitsToQdq(NbitsToQdq.Config()), quantized, "unsigned")
    dq = [node for node in onnx.load(str(unsigned.model.model_file)).graph.node if node.op_type == "DequantizeLinear"]
    assert [len(node.input) for node in dq] == [3, 3]  # uint4 needs MatMulNBits' implicit 8


def test_nbits_to_qdq_excludes_nodes_and_adds_the_bias(tmp_path: Path) -> None:
    from passes.quantize.nbits_to_qdq import NbitsToQdq

    quantized = _int4(tmp_path, _two_matmuls(), is_symmetric=False)
    proto = onnx.load(str(quantized.model_file))
    nbits = [node for node in proto.graph.node if node.op_type == "MatMulNBits"]
    head = next(node for node in nbits if node.output[0] == "y")
    layer = next(node for node in nbits if node is not head)
    bias = np.random.default_rng(9).standard_normal(N).astype(np.float32)
    proto.graph.initializer.append(numpy_helper.from_array(bias, "layer_bias"))
    while len(layer.input) < 5:
        layer.input.append("")
    layer.input.append("layer_bias")
    with_bias = _artifact(tmp_path / "bias", proto)
    result = _apply(tmp_path, NbitsToQdq(NbitsToQdq.Config(nodes_to_exclude=[head.name])), with_bias, "partial")
    assert _op_types(result.model.model_file).count("MatMulNBits") == 1
    assert "Add" in _op_types(result.model.model_file)
    assert result.details["skipped"] == {head.name: "in nodes_to_exclude"}
    x = np.random.default_rng(3).standard_normal((4, K)).astype(np.float32)
    np.testing.assert_allclose(_unoptimized(result.model.model_file, x), _outputs(with_bias.model_file, x), rtol=1e-4, atol=1e-5)


# -- add_metadata ------------------------------------------------------------------------------------
def _props(model_file: Path) -> dict[str, str]:
    return {entry.key: entry.value for entry in onnx.load(str(model_file)).metadata_props}


def test_add_metadata_writes_lineage_and_user_keys(tmp_path: Path) -> None:
    from passes.graph.add_metadata import AddMetadata

    proto = _dynamic_model()
    onnx.helper.set_model_props(proto, {"producer_note": "exported", "owner": "old"})
    source = _artifact(tmp_path / "in", proto)
    source = ModelArtifact(
        source.format, source.path, source.digest, attrs={"model": "org/tiny", "commit": "abc123", "task": "feature-extraction"}
    )
    config = AddMetadata.Config(metadata={"owner": "npu-team", "release": 3, "calibrated": True}, graph_name="tiny-npu")
    result = _apply(tmp_path, AddMetadata(config), source, "meta")
    props = _props(result.model.model_file)
    assert props["owner"] == "npu-team" and props["release"] == "3" and props["calibrated"] == "true"
    assert props["producer_note"] == "exported"  # kept
    assert props["kiln.step"] == "meta"
    assert props["kiln.input_digest"] == source.digest
    assert props["kiln.input_format"] == "onnx"
    assert (props["kiln.hf_model"], props["kiln.hf_commit"], props["kiln.task"]) == ("org/tiny", "abc123", "feature-extraction")
    assert props["kiln.version"]
    assert onnx.load(str(result.model.model_file)).graph.name == "tiny-npu"
    assert result.details["replaced"] == ["owner"] and result.details["kept"] == ["producer_note"]
    assert list(props) == sorted(props)


def test_add_metadata_twice_gives_the_same_bytes(tmp_path: Path) -> None:
    from passes.graph.add_metadata import AddMetadata

    source = _artifact(tmp_path / "in", _dynamic_model())
    config = AddMetadata.Config(metadata={"b": "2", "a": "1"}, graph_name="g")
    first = _apply(tmp_path / "one", AddMetadata(config), source, "meta")
    second = _apply(tmp_path / "two", AddMetadata(config), source, "meta")
    assert first.model.model_file.read_bytes() == second.model.model_file.read_bytes()
    assert first.model.digest == second.model.digest


def test_add_metadata_without_lineage_and_reserved_keys(tmp_path: Path) -> None:
    from passes.graph.add_metadata import AddMetadata

    source = _artifact(tmp_path / "in", _dynamic_model())
    result = _apply(tmp_path, AddMetadata(AddMetadata.Config(metadata={"k": "v"}, lineage=False)), source, "plain")
    assert _props(result.model.model_file) == {"k": "v"}
    with pytest.raises(ValueError, match="Kiln's lineage"):
        AddMetadata.Config(metadata={"kiln.step": "x"})
