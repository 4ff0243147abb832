"""ort_quantize's preprocessing of a model past 2 GB runs in a child process (its memory goes back
to the system before the quantizer starts), and what the child logged still decides the outcome.
The models here are tiny: ``large=True`` is what the pass passes for a model past the threshold."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from passes.common.library_logs import LibraryMessage
from passes.quantize import ort_quantizers
from passes.quantize.ort_quantizers import preprocess_for_quantization


def _save(folder: Path, nodes: list, weights: dict[str, np.ndarray], domains: tuple[str, ...] = ()) -> Path:
    graph = helper.make_graph(
        nodes,
        "large",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(domain, 1) for domain in domains)]
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=10), str(folder / "model.onnx"))
    return folder / "model.onnx"


def _workdir(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()  # the pass's workdir exists before it preprocesses
    return tmp_path / "work"


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"W": (rng.standard_normal((64, 64)) * 0.1).astype(np.float32), "b": np.zeros(64, np.float32)}


def test_a_large_models_preprocessing_runs_in_a_child_and_writes_external_data(tmp_path: Path, monkeypatch) -> None:
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Add", ["h", "b"], ["y"], name="add")]
    source = _save(tmp_path / "in", nodes, _weights())

    def not_here(*args, **kwargs):
        raise AssertionError("preprocessing ran in the pass's own process")

    monkeypatch.setattr(ort_quantizers, "_quant_pre_process", not_here)  # the child imports its own copy
    messages: list[LibraryMessage] = []
    notes: list[str] = []
    target, state = preprocess_for_quantization(source, _workdir(tmp_path), True, False, True, messages, notes)
    assert (state, notes) == ("optimized", [])
    assert target == tmp_path / "work" / "preprocessed.onnx" and (tmp_path / "work" / "preprocessed.onnx.data").is_file()
    optimized = onnx.load(str(target))  # the optimizer fused MatMul + Add into one Gemm, weights read back from the data file
    assert [node.op_type for node in optimized.graph.node] == ["Gemm"]
    assert numpy_helper.to_array(next(t for t in optimized.graph.initializer if t.dims == [64, 64])).shape == (64, 64)


def test_the_childs_logged_optimizer_failure_still_means_shape_inference_only(tmp_path: Path) -> None:
    # onnxruntime cannot open a model with an unknown custom op: quant_pre_process only logs the
    # optimizer's failure, in the child; relayed, it decides the state and the note
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm1"),
        helper.make_node("Foo", ["h"], ["y"], name="foo", domain="com.example"),
    ]
    source = _save(tmp_path / "in", nodes, _weights(), domains=("com.example",))
    messages: list[LibraryMessage] = []
    notes: list[str] = []
    target, state = preprocess_for_quantization(source, _workdir(tmp_path), True, False, True, messages, notes)
    assert state == "shape_inference_only" and target.is_file()
    assert any(m.source.startswith("onnxruntime.quantization") and m.level == "ERROR" for m in messages)
    assert len(notes) == 1 and "graph optimization failed" in notes[0] and "com.example:Foo" in notes[0]


def _killed(*args: object) -> list[LibraryMessage]:
    """Stands for a child the kernel killed for memory (it runs in the child: pickled by name)."""
    os.kill(os.getpid(), signal.SIGKILL)
    return []


def test_a_child_killed_for_memory_leaves_the_model_as_given_with_the_reason(tmp_path: Path, monkeypatch) -> None:
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Add", ["h", "b"], ["y"], name="add")]
    source = _save(tmp_path / "in", nodes, _weights())
    monkeypatch.setattr(ort_quantizers, "_preprocess_logged", _killed)
    messages: list[LibraryMessage] = []
    notes: list[str] = []
    target, state = preprocess_for_quantization(source, _workdir(tmp_path), True, False, True, messages, notes)
    assert state == "failed" and target == tmp_path / "work" / "input" / "model.onnx" and target.is_file()
    assert len(notes) == 1 and notes[0].startswith("preprocessing (quant_pre_process) failed, so the model was quantized without it")
    assert "BrokenProcessPool" in notes[0]
