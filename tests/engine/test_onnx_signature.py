"""A pass that runs on no target (static calibration) gets synthetic data shaped after the inputs
its ONNX model's graph declares, read from the file without a runtime."""

from __future__ import annotations

from pathlib import Path

import onnx
from engine_helpers import make_tiny_encoder

from engine.core.artifact import ModelArtifact
from engine.core.target import TensorSpec
from engine.execute.worker import onnx_signature


def test_the_graph_inputs_are_the_signature_and_weights_are_not(tmp_path: Path) -> None:
    make_tiny_encoder(tmp_path / "model" / "model.onnx")
    model = ModelArtifact.from_folder("onnx", tmp_path / "model")
    specs = onnx_signature(model)
    graph = onnx.load(str(tmp_path / "model" / "model.onnx")).graph
    declared = [value.name for value in graph.input if value.name not in {init.name for init in graph.initializer}]
    assert specs is not None and [spec.name for spec in specs] == declared
    assert all(isinstance(spec, TensorSpec) and spec.dtype == "int64" and len(spec.shape) == 2 for spec in specs)
    assert all(isinstance(dim, str) for spec in specs for dim in spec.shape)  # batch and sequence stay symbolic


def test_a_model_of_another_format_has_no_signature_without_a_target(tmp_path: Path) -> None:
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    assert onnx_signature(ModelArtifact(format="hf", path=tmp_path / "hf", digest="")) is None
