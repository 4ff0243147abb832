"""onnx_peephole on small graphs built here: each of Olive's switches, and onnxruntime runs the result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from engine.core import ModelArtifact, PassContext, PassResult
from passes.graph.onnx_peephole import OnnxPeephole

#: how Olive's recipes after a transformer fusion set the peephole optimizer
RECIPE = {"onnxscript_optimize": False, "fuse_reshape_operations": False, "fix_com_microsoft_opset": True, "cast_chain_elimination": True}


def _graph(nodes: list[Any], initializers: dict[str, np.ndarray], functions: list[Any] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
        [numpy_helper.from_array(value, name) for name, value in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8, functions=functions or [])


def _casts_and_reshapes() -> onnx.ModelProto:
    """y = flatten(reshape(relu(cast32(cast16(x))))): a Cast round trip and a Reshape before a flatten."""
    nodes = [
        helper.make_node("Cast", ["x"], ["half"], to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["half"], ["back"], to=TensorProto.FLOAT),
        helper.make_node("Relu", ["back"], ["r"]),
        helper.make_node("Reshape", ["r", "s1"], ["r1"]),
        helper.make_node("Reshape", ["r1", "flat"], ["y"]),
    ]
    return _graph(nodes, {"s1": np.array([-1, 3, 2], np.int64), "flat": np.array([-1], np.int64)})


def _run(tmp_path: Path, model: onnx.ModelProto, **config: Any) -> PassResult:
    (tmp_path / "in").mkdir(parents=True)
    onnx.save(model, str(tmp_path / "in" / "model.onnx"))
    (tmp_path / "work").mkdir()
    ctx = PassContext(step_id="peephole", workdir=tmp_path / "work", output_dir=tmp_path / "out")
    return OnnxPeephole(OnnxPeephole.Config(**config))(ModelArtifact.from_folder("onnx", tmp_path / "in"), ctx)


def _ops(result: PassResult) -> list[str]:
    return [node.op_type for node in onnx.load(str(result.model.model_file)).graph.node]


def _same_outputs(before: onnx.ModelProto, result: PassResult) -> None:
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    want = ort.InferenceSession(before.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(result.model.model_file), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, atol=1e-2)  # the round trip through fp16 was the only rounding


def test_the_recipes_setting_removes_the_cast_round_trip_and_nothing_else(tmp_path: Path) -> None:
    model = _casts_and_reshapes()
    result = _run(tmp_path, model, **RECIPE)
    assert _ops(result) == ["Identity", "Relu", "Reshape", "Reshape"]
    assert result.details["applied"]["cast_chain_elimination"] == 2
    _same_outputs(model, result)


def test_the_rule_checks_only_the_types_at_both_ends_as_olives_does(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT32),
        helper.make_node("Cast", ["i"], ["y"], to=TensorProto.FLOAT),
    ]
    result = _run(tmp_path, _graph(nodes, {}), **RECIPE)
    assert _ops(result) == ["Identity"]  # float → int32 → float truncates, and Olive's rule removes it too


def test_a_cast_chain_that_ends_in_another_type_stays(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Cast", ["x"], ["half"], to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["half"], ["y"], to=TensorProto.DOUBLE),
    ]
    model = _graph(nodes, {})
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    assert _ops(_run(tmp_path, model, **RECIPE)) == ["Cast", "Cast"]


def test_the_reshape_before_a_flatten_is_dropped(tmp_path: Path) -> None:
    model = _casts_and_reshapes()
    result = _run(tmp_path, model, onnxscript_optimize=False)
    assert _ops(result) == ["Cast", "Cast", "Relu", "Reshape"]
    assert result.details["applied"]["fuse_reshape_operations"] == 1
    _same_outputs(model, result)


def test_onnxscripts_optimizer_runs_by_default(tmp_path: Path) -> None:
    model = _casts_and_reshapes()
    result = _run(tmp_path, model)
    assert result.details["applied"]["onnxscript_optimize"] == "run"
    assert _ops(result).count("Reshape") == 1
    _same_outputs(model, result)


def test_the_microsoft_opset_is_declared_where_a_function_uses_it(tmp_path: Path) -> None:
    inner = helper.make_node("Gelu", ["a"], ["b"], domain="com.microsoft")
    function = helper.make_function("custom", "Act", ["a"], ["b"], [inner], [helper.make_opsetid("", 17)])
    nodes = [helper.make_node("Act", ["x"], ["y"], domain="custom")]
    model = _graph(nodes, {}, [function])
    model.opset_import.append(helper.make_opsetid("custom", 1))
    result = _run(tmp_path, model, **{**RECIPE, "cast_chain_elimination": False})
    written = onnx.load(str(result.model.model_file))
    assert ("com.microsoft", 1) in {(entry.domain, entry.version) for entry in written.opset_import}
    assert "com.microsoft" in {entry.domain for entry in written.functions[0].opset_import}
    assert result.details["applied"]["fix_com_microsoft_opset"] == ["model", "function custom:Act"]
    ort.InferenceSession(str(result.model.model_file), providers=["CPUExecutionProvider"])  # loads
