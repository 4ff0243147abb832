"""Helpers shared by the engine tests: a tiny real ONNX encoder and workflows written to tmp
folders. A module with its own name (not conftest) so that every test imports this one, whichever
conftest pytest loaded last."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper


def make_tiny_encoder(path: Path, hidden: int = 32, vocab: int = 1000, seed: int = 0) -> Path:
    """input_ids, attention_mask [batch, sequence] -> Gather(embeddings) -> MatMul -> Add ->
    MatMul -> last_hidden_state [batch, sequence, hidden]; masked positions zeroed."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "embeddings"),
        numpy_helper.from_array((rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32) * 0.1, "b1"),
        numpy_helper.from_array((rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "last_axis"),
    ]
    nodes = [
        helper.make_node("Gather", ["embeddings", "input_ids"], ["embedded"]),
        helper.make_node("MatMul", ["embedded", "w1"], ["h1"]),
        helper.make_node("Add", ["h1", "b1"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["h3"]),
        helper.make_node("MatMul", ["h3", "w2"], ["h4"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "last_axis"], ["mask_3d"]),
        helper.make_node("Mul", ["h4", "mask_3d"], ["last_hidden_state"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-tests")
    model.ir_version = 10
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path


def tiny_workflow(model_path: Path, **overrides: Any) -> dict[str, Any]:
    """A fast workflow over the tiny encoder: FP32 reference and dynamic INT8 per-tensor/per-channel."""
    workflow: dict[str, Any] = {
        "version": 1,
        "name": "tiny",
        "input": {"format": "onnx", "path": str(model_path)},
        "data": {"rows": {"source": "synthetic", "samples": 8, "sequence_length": 16}},
        "targets": [{"id": "cpu", "runtime": "onnxruntime", "intra_op_threads": 1}],
        "steps": [{"id": "int8", "pass": "ort_quantize", "config": {"mode": "dynamic"}, "search": {"per_channel": [False, True]}}],
        "evaluate": [
            {"id": "fidelity", "evaluator": "fidelity", "config": {"data": "rows"}},
            {
                "id": "latency",
                "evaluator": "latency",
                "config": {"batch_size": 1, "sequence_length": 16, "warmup": 2, "runs": 10, "quiet_wait_s": 2},
            },
        ],
        "select": {
            "objective": {"metric": "latency.p50_ms", "goal": "min"},
            "constraints": [{"metric": "fidelity.cosine_mean", "min": 0.9}],
        },
    }
    workflow.update(overrides)
    return workflow


def write_workflow(folder: Path, workflow: dict[str, Any], name: str = "workflow.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(workflow, sort_keys=False))
    return path


def engine_cmd() -> list[str]:
    return [sys.executable, "-m", "engine.cli"]
