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
