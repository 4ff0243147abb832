"""onnx_simplify on small graphs built here: onnxslim simplifies, onnxruntime runs the result."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from engine.core import ModelArtifact, PassContext, PassError, PassResult
from passes.graph.onnx_simplify import OnnxSimplify


def _model(nodes: list, initializers: dict[str, np.ndarray], inputs: dict, outputs: dict) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in outputs.items()],
        [numpy_helper.from_array(value, name) for name, value in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _cluttered() -> onnx.ModelProto:
    """11 nodes computing y = 2 * sigmoid(x + c1 * c2): a constant Mul, an Identity, a Reshape to
    the shape it already has (from Constant + Concat), a duplicated Sigmoid and a dead Relu."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Mul", ["c1", "c2"], ["c"], name="const_mul"),
        helper.make_node("Add", ["x", "c"], ["h"], name="add"),
        helper.make_node("Identity", ["h"], ["i"], name="identity"),
        helper.make_node("Constant", [], ["d0"], name="dim0", value=numpy_helper.from_array(np.array([-1], np.int64))),
        helper.make_node("Constant", [], ["d1"], name="dim1", value=numpy_helper.from_array(np.array([8], np.int64))),
        helper.make_node("Concat", ["d0", "d1"], ["shape"], name="concat", axis=0),
        helper.make_node("Reshape", ["i", "shape"], ["r"], name="reshape"),
        helper.make_node("Sigmoid", ["r"], ["s1"], name="sigmoid_1"),
        helper.make_node("Sigmoid", ["r"], ["s2"], name="sigmoid_2"),
        helper.make_node("Add", ["s1", "s2"], ["y"], name="sum"),
        helper.make_node("Relu", ["x"], ["unused"], name="dead"),
    ]
    weights = {"c1": rng.standard_normal(8).astype(np.float32), "c2": rng.standard_normal(8).astype(np.float32)}
    return _model(nodes, weights, {"x": ["batch", 8]}, {"y": ["batch", 8]})


def _conv_bn() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    weights = {
        "W": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "gamma": rng.uniform(0.5, 1.5, 4).astype(np.float32),
        "beta": rng.standard_normal(4).astype(np.float32),
        "mean": rng.standard_normal(4).astype(np.float32),
        "var": rng.uniform(0.5, 1.5, 4).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["y"], name="bn"),
    ]
    return _model(nodes, weights, {"x": ["batch", 3, 8, 8]}, {"y": ["batch", 4, 8, 8]})


def _attention_like() -> onnx.ModelProto:
    """softmax(q @ k) @ v of three inputs: the MatMul + Softmax pattern of unfused attention."""
    nodes = [
        helper.make_node("MatMul", ["q", "k"], ["scores"], name="qk"),
        helper.make_node("Softmax", ["scores"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["y"], name="pv"),
    ]
    return _model(nodes, {}, {"q": [4, 4], "k": [4, 4], "v": [4, 4]}, {"y": [4, 4]})


def _artifact(folder: Path, model: onnx.ModelProto) -> ModelArtifact:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    return ModelArtifact.from_folder("onnx", folder)


def _simplify(root: Path, model: onnx.ModelProto, **config: object) -> PassResult:
    source = _artifact(root / "in", model)
    (root / "work").mkdir(parents=True)
    ctx = PassContext(step_id="simplify", workdir=root / "work", output_dir=root / "out")
    return OnnxSimplify(OnnxSimplify.Config(**config))(source, ctx)


def _run(model_file: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _ops(model_file: Path) -> list[str]:
    return [node.op_type for node in onnx.load(str(model_file)).graph.node]


X = np.random.default_rng(100).standard_normal((5, 8)).astype(np.float32)
IMAGES = np.random.default_rng(101).standard_normal((2, 3, 8, 8)).astype(np.float32)


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the engine runs passes with cwd = workdir; tools drop files there


def test_folds_constants_and_removes_dead_identity_and_duplicate_nodes(tmp_path: Path) -> None:
    result = _simplify(tmp_path, _cluttered())
    assert _ops(result.model.model_file) == ["Add", "Sigmoid", "Add"]
    details = result.details
    assert (details["nodes_before"], details["nodes_after"]) == (11, 3)
    assert details["op_counts_before"]["Sigmoid"] == 2
    assert details["op_counts_after"] == {"Add": 2, "Sigmoid": 1}
    assert details["op_delta"] == {"Concat": -1, "Constant": -2, "Identity": -1, "Mul": -1, "Relu": -1, "Reshape": -1, "Sigmoid": -1}
    assert details["skipped_optimizations"] == []


def test_simplified_model_passes_checker_and_matches_the_input(tmp_path: Path) -> None:
    result = _simplify(tmp_path, _cluttered())
    onnx.checker.check_model(str(result.model.model_file), full_check=True)
    # the folded c1 * c2 is the same float32 product onnxruntime computes at run time: bit-identical
    np.testing.assert_array_equal(_run(result.model.model_file, {"x": X}), _run(tmp_path / "in" / "model.onnx", {"x": X}))


def test_same_input_and_config_give_the_same_bytes(tmp_path: Path) -> None:
    first = _simplify(tmp_path / "a", _cluttered())
    second = _simplify(tmp_path / "b", _cluttered())
    assert first.model.digest == second.model.digest
    assert first.model.model_file.read_bytes() == second.model.model_file.read_bytes()


def test_each_optimization_can_be_turned_off(tmp_path: Path) -> None:
    assert "Mul" in _ops(_simplify(tmp_path / "fold", _cluttered(), constant_folding=False).model.model_file)
    assert _ops(_simplify(tmp_path / "cse", _cluttered(), subexpression_elimination=False).model.model_file).count("Sigmoid") == 2
    no_dne = _simplify(tmp_path / "dne", _cluttered(), dead_node_elimination=False)
    assert "Identity" in _ops(no_dne.model.model_file)
    assert no_dne.details["skipped_optimizations"] == ["dead_node_elimination"]


def test_shape_inference_stores_intermediate_shapes_unless_disabled(tmp_path: Path) -> None:
    with_shapes = onnx.load(str(_simplify(tmp_path / "on", _cluttered()).model.model_file))
    without = onnx.load(str(_simplify(tmp_path / "off", _cluttered(), shape_inference=False).model.model_file))
    assert {v.name for v in with_shapes.graph.value_info} >= {"r", "s1"}
    assert len(without.graph.value_info) == 0


def test_conv_batchnorm_fuses_and_matches(tmp_path: Path) -> None:
    result = _simplify(tmp_path, _conv_bn())
    assert _ops(result.model.model_file) == ["Conv"]
    # BN folded into the Conv weights changes the rounding of each product: float32 eps-level differences
    np.testing.assert_allclose(
        _run(result.model.model_file, {"x": IMAGES}), _run(tmp_path / "in" / "model.onnx", {"x": IMAGES}), rtol=1e-5, atol=1e-5
    )


def test_fusion_pattern_can_be_skipped_by_name(tmp_path: Path) -> None:
    assert _ops(_simplify(tmp_path / "skip", _conv_bn(), skip_fusion_patterns=["FusionConvBN"]).model.model_file) == [
        "Conv",
        "BatchNormalization",
    ]
    assert _ops(_simplify(tmp_path / "off", _conv_bn(), graph_fusion=False).model.model_file) == ["Conv", "BatchNormalization"]


def test_unknown_fusion_pattern_is_a_pass_error_listing_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(PassError, match=r"onnxslim has no pattern FusionConvBatchNorm; known: .*FusionConvBN"):
        _simplify(tmp_path, _conv_bn(), skip_fusion_patterns=["FusionConvBatchNorm"])


def test_pattern_named_twice_is_rejected_by_the_config() -> None:
    with pytest.raises(ValidationError, match="names a pattern twice"):
        OnnxSimplify.Config(skip_fusion_patterns=["FusionGemm", "FusionGemm"])


def test_unfused_attention_gets_a_note_about_running_ort_fusion_first(tmp_path: Path) -> None:
    result = _simplify(tmp_path, _attention_like())
    assert any("run ort_fusion before onnx_simplify" in note for note in result.notes)
    assert _simplify(tmp_path / "cnn", _conv_bn()).notes == []


def test_nothing_is_printed_and_cwd_stays_clean(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    _simplify(tmp_path / "run", _cluttered())
    captured = capfd.readouterr()
    assert (captured.out, captured.err) == ("", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert list((tmp_path / "run" / "work").iterdir()) == []
