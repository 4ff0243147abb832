"""Helpers shared by the engine tests: a tiny real ONNX encoder and workflows written to tmp
folders. A module with its own name (not conftest) so that every test imports this one, whichever
conftest pytest loaded last."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import onnx
import yaml

from engine.conformance import tiny_encoder


def make_tiny_encoder(path: Path, hidden: int = 32, vocab: int = 1000, seed: int = 0) -> Path:
    """input_ids, attention_mask [batch, sequence] -> Gather(embeddings) -> MatMul -> Add ->
    MatMul -> last_hidden_state [batch, sequence, hidden]; masked positions zeroed."""
    model = tiny_encoder(hidden, vocab, seed)
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
            # a runoff is an evaluation: off, so the counts of the tests that use this workflow do not
            # depend on whether two candidates happened to tie (tests/engine/test_runoff.py turns it on)
            "runoff": False,
        },
    }
    workflow.update(overrides)
    return workflow


def two_targets(model_path: Path, seconds: float) -> dict[str, Any]:
    """The tiny workflow on two targets, each with a sleeping pass of its own (``seconds`` long)."""
    workflow = tiny_workflow(model_path)
    workflow["targets"] = [
        {"id": "a", "runtime": "onnxruntime", "intra_op_threads": 1},
        {"id": "b", "runtime": "onnxruntime", "intra_op_threads": 1, "inter_op_threads": 1},
    ]
    # each target has a slow pass of its own (not the same job: their keys differ by the seconds):
    # searched one after the other, b's would start after a's ended
    workflow["steps"] = [
        {"id": "slow_a", "pass": "sleep", "targets": ["a"], "config": {"seconds": seconds}},
        {"id": "slow_b", "pass": "sleep", "targets": ["b"], "config": {"seconds": seconds + 0.25}},
    ]
    workflow["evaluate"] = [{"id": "fidelity", "evaluator": "fidelity", "config": {"data": "rows"}}]
    workflow["select"] = {"objective": {"metric": "fidelity.cosine_mean", "goal": "max"}}
    return workflow


def write_workflow(folder: Path, workflow: dict[str, Any], name: str = "workflow.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(workflow, sort_keys=False))
    return path


def engine_cmd() -> list[str]:
    return [sys.executable, "-m", "engine"]
