"""qnn_preprocess: onnxruntime's qnn_preprocess_model on small graphs; onnxruntime runs the result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from engine.core import ModelArtifact, PassContext, PassResult
from passes.quantize.qnn_preprocess import QnnPreprocess


def _erf_gelu() -> onnx.ModelProto:
    """y = x * (1 + erf(x / sqrt(2))) * 0.5, as exporters spell a GELU."""
    nodes = [
        helper.make_node("Div", ["x", "sqrt2"], ["scaled"]),
        helper.make_node("Erf", ["scaled"], ["erf"]),
        helper.make_node("Add", ["erf", "one"], ["shifted"]),
        helper.make_node("Mul", ["x", "shifted"], ["product"]),
        helper.make_node("Mul", ["product", "half"], ["y"]),
    ]
    weights = {"sqrt2": np.array(np.sqrt(2.0), np.float32), "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
    graph = helper.make_graph(
        nodes,
        "gelu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _relu() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(tmp_path: Path, model: onnx.ModelProto, **config: Any) -> PassResult:
    (tmp_path / "in").mkdir()
    onnx.save(model, str(tmp_path / "in" / "model.onnx"))
    (tmp_path / "work").mkdir()
    ctx = PassContext(step_id="pre", workdir=tmp_path / "work", output_dir=tmp_path / "out")
    return QnnPreprocess(QnnPreprocess.Config(**config))(ModelArtifact.from_folder("onnx", tmp_path / "in"), ctx)


def _outputs(path: Path) -> np.ndarray:
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_an_erf_gelu_becomes_one_gelu(tmp_path: Path) -> None:
    result = _run(tmp_path, _erf_gelu(), fuse_layernorm=True)
    ops = [node.op_type for node in onnx.load(str(result.model.model_file)).graph.node]
    assert ops == ["Gelu"] and result.details["modified"] is True
    np.testing.assert_allclose(_outputs(result.model.model_file), _outputs(tmp_path / "in" / "model.onnx"), atol=1e-5)


def test_a_graph_without_those_patterns_keeps_its_ops(tmp_path: Path) -> None:
    result = _run(tmp_path, _relu())
    assert [node.op_type for node in onnx.load(str(result.model.model_file)).graph.node] == ["Relu"]
