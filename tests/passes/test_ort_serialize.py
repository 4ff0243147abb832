"""ort_serialize on a small graph: onnxruntime writes the offline-optimized model (and the ORT
format), the result runs with the same outputs, and the pass is target-dependent above basic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from engine.core import ModelArtifact, PassContext, PassResult
from passes.compile.ort_serialize import ORT_FILE, OrtSerialize
from targets.onnxruntime import OnnxRuntimeTarget

X = np.random.default_rng(7).standard_normal((4, 16)).astype(np.float32)


def _model() -> onnx.ModelProto:
    """x -> MatMul(Transpose(W0)) -> Mul(0.5) -> Add(b) -> Identity -> y (basic folds the Transpose and
    drops the Identity; extended fuses MatMul + Mul into FusedMatMul)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Transpose", ["W0"], ["W"]),
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Mul", ["h", "scale"], ["s"]),
        helper.make_node("Add", ["s", "b"], ["a"]),
        helper.make_node("Identity", ["a"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
        [
            numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W0"),
            numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b"),
            numpy_helper.from_array(np.array(0.5, np.float32), "scale"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _serialize(root: Path, target: OnnxRuntimeTarget | None = None, **config: object) -> tuple[ModelArtifact, PassResult]:
    (root / "in").mkdir(parents=True)
    onnx.save(_model(), str(root / "in" / "model.onnx"))
    source = ModelArtifact.from_folder("onnx", root / "in")
    (root / "work").mkdir()
    ctx = PassContext(step_id="serialize", workdir=root / "work", output_dir=root / "out", target=target)
    return source, OrtSerialize(OrtSerialize.Config(**config))(source, ctx)


def _run(path: Path, level: str = "disable") -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}.get(
        level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    )
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]


def cpu_target() -> OnnxRuntimeTarget:
    return OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="cpu", runtime="onnxruntime"))


@pytest.mark.parametrize("level", ["basic", "extended", "all"])
def test_the_optimized_model_gives_the_same_outputs(tmp_path: Path, level: str) -> None:
    source, result = _serialize(tmp_path, None if level == "basic" else cpu_target(), level=level)
    assert result.model.format == "onnx" and result.model.model_file.name == "model.onnx"
    ops = {node.op_type for node in onnx.load(str(result.model.model_file)).graph.node}
    assert "Identity" not in ops and "Transpose" not in ops  # basic's rewrites, at every level
    if level != "basic":
        assert "FusedMatMul" in ops
    # opened with optimizations off, the saved graph is the optimized one, outputs unchanged
    np.testing.assert_allclose(_run(result.model.model_file), _run(source.model_file), rtol=1e-5, atol=1e-5)
    d = result.details
    assert d["level"] == level and d["portable"] is (level == "basic")
    assert d["providers"] == ["CPUExecutionProvider"]
    assert d["nodes_after"] < d["nodes_before"]
    assert d["ort_file"] is None and not (result.model.path / ORT_FILE).exists()
    assert bool(result.notes) is (level != "basic")


def test_ort_format_is_written_beside_and_loads(tmp_path: Path) -> None:
    source, result = _serialize(tmp_path, cpu_target(), level="basic", ort_format=True)
    ort_file = result.model.path / ORT_FILE
    assert ort_file.is_file() and result.details["ort_bytes"] == ort_file.stat().st_size
    assert ort_file.read_bytes()[4:8] == b"ORTM"  # the flatbuffer identifier of the ORT format
    np.testing.assert_allclose(_run(ort_file), _run(source.model_file), rtol=1e-5, atol=1e-5)


FINGERPRINT = {"runtime": "onnxruntime", "options": {"providers": ["CPUExecutionProvider"], "intra_op_threads": 2}}


def test_target_dependence_follows_the_level() -> None:
    assert OrtSerialize.target_facet(OrtSerialize.Config(level="basic").to_json(), FINGERPRINT) is None
    assert OrtSerialize.target_facet(OrtSerialize.Config(level="extended").to_json(), FINGERPRINT) == FINGERPRINT
    assert OrtSerialize.target_facet(OrtSerialize.Config().to_json(), FINGERPRINT) == FINGERPRINT  # default: all
    with pytest.raises(ValidationError):
        OrtSerialize.Config(level="layout")


def test_other_passes_answer_with_their_class_attribute() -> None:
    from passes.quantize.ort_quantize_accuracy import OrtQuantizeAccuracy

    assert OrtQuantizeAccuracy.target_facet({}, FINGERPRINT) == FINGERPRINT  # target_dependent: the whole target
    assert OrtSerialize.target_facet(OrtSerialize.Config(level="basic").to_json(), None) is None


def _workflow(tmp_path: Path) -> Path:
    import yaml

    (tmp_path / "in").mkdir()
    onnx.save(_model(), str(tmp_path / "in" / "model.onnx"))
    workflow = {
        "version": 1,
        "name": "serialize",
        "input": {"format": "onnx", "path": str(tmp_path / "in" / "model.onnx")},
        "targets": [{"id": "one", "runtime": "onnxruntime"}, {"id": "two", "runtime": "onnxruntime", "intra_op_threads": 1}],
        "steps": [
            {"id": "portable", "pass": "ort_serialize", "config": {"level": "basic"}},
            {"id": "native", "pass": "ort_serialize", "after": "portable"},
        ],
        "evaluate": [{"id": "latency", "evaluator": "latency", "config": {"runs": 10}}],
        # start-up is a metric like any other: it can be what the selection minimizes
        "select": {"objective": {"metric": "latency.startup_warm_ms", "goal": "min"}},
    }
    path = tmp_path / "workflow.yaml"
    path.write_text(yaml.safe_dump(workflow, sort_keys=False))
    return path


def test_the_planner_gives_a_basic_job_no_target_and_an_all_job_its_target(tmp_path: Path) -> None:
    from engine.plan.planner import build_plan
    from engine.workflow import load_workflow

    plan = build_plan(load_workflow(_workflow(tmp_path)))
    targets: dict[str, set[str | None]] = {"portable": set(), "native": set()}
    for job in plan.jobs.values():
        targets[job.step_id].add(job.target)
    assert targets["portable"] == {None}  # one job, shared by both targets
    assert targets["native"] == {"one", "two"}  # one job per target, keyed by its fingerprint
