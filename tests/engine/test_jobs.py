"""Typed jobs: a work order survives the job file unchanged, and the planner's spec of a job holds
the datasets and evaluations its key names."""

from __future__ import annotations

from pathlib import Path

from engine_helpers import tiny_workflow, write_workflow

from engine.core.artifact import ModelArtifact
from engine.plan.jobs import DatasetInput, MeasuringEvaluation, TargetRef, WorkOrder
from engine.plan.planner import build_plan
from engine.workflow import load_workflow


def test_a_work_order_round_trips_through_json(tmp_path):
    model = ModelArtifact(format="onnx", path=tmp_path / "m", digest="sha256:m", attrs={"opset": 17})
    order = WorkOrder(
        kind="pass",
        key="k" * 64,
        key_doc={"kind": "pass"},
        plugin="copy",
        config={"tag": "a"},
        step_id="first",
        model=model,
        input_model=model,
        target=TargetRef(runtime="onnxruntime", config={"id": "cpu"}),
        datasets={"rows": DatasetInput(path="/x/dataset.npz"), "calib": DatasetInput(source="synthetic", config={"samples": 8})},
        evaluations={"fidelity": MeasuringEvaluation(plugin="fidelity", version="1", config={"data": "rows"})},
    ).placed(tmp_path / "store", tmp_path / "store" / "tmp" / "pass-x")
    assert WorkOrder.from_json(order.to_json()) == order
    assert order.result == str(Path(order.staging or "") / "result.json")


def test_the_plan_gives_each_job_a_spec_with_its_datasets_and_target(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"][0]["config"] = {"mode": "static", "calibration": "rows"}
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    plan = build_plan(resolved)
    specs = [plan.spec(job_id) for job_id in plan.job_order()]
    assert specs and all(spec.datasets == ("rows",) and spec.pass_name == "ort_quantize" for spec in specs)
    assert [spec.label for spec in specs] == [plan.jobs[spec.job_id].label for spec in specs]
