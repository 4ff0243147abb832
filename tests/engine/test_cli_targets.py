"""`engine targets`: the execution providers usable on this host, a workflow's targets'
availability; `engine plan` and `engine run` with a target that cannot run here or whose
first-choice execution provider takes no node."""

from __future__ import annotations

import json

from engine_helpers import tiny_workflow, write_workflow

from engine.cli.main import main

AZURE_FIRST = {"id": "azure", "runtime": "onnxruntime", "providers": ["azure", "cpu"], "intra_op_threads": 1}
TRT = {"id": "trt", "runtime": "onnxruntime", "providers": ["tensorrt", "cuda", "cpu"], "tensorrt": {"fp16": True}}


def test_targets_lists_the_execution_providers_and_why_not_here(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    assert "onnxruntime: on this host" in out
    assert "CPUExecutionProvider (cpu)" in out and "CUDAExecutionProvider (cuda)" in out
    assert "onnxruntime-gpu" in out and "Windows only" in out


def test_targets_of_a_workflow_say_which_run_here(tmp_path, tiny_onnx, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    workflow = tiny_workflow(tiny_onnx, targets=[{"id": "cpu", "runtime": "onnxruntime"}, TRT])
    path = write_workflow(tmp_path, workflow)
    assert main(["targets", str(path)]) == 0
    out = capsys.readouterr().out
    assert "TensorrtExecutionProvider" in out and "no NVIDIA GPU" in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 3}
    assert "yes" in rows["cpu"] and "no" in rows["trt"]


def test_plan_shows_an_unavailable_target_with_its_reason(tmp_path, tiny_onnx, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    workflow = tiny_workflow(tiny_onnx, targets=[{"id": "cpu", "runtime": "onnxruntime"}, TRT])
    path = write_workflow(tmp_path, workflow)
    assert main(["plan", str(path), "--store", str(tmp_path / "store")]) == 0
    out = capsys.readouterr().out
    assert "target trt SKIPPED" in out and "TensorrtExecutionProvider" in out and "nvidia-smi" in out


def test_a_run_on_a_first_choice_ep_that_takes_no_node_fails_its_candidates(tmp_path, tiny_onnx, capsys):
    workflow = tiny_workflow(tiny_onnx, targets=[AZURE_FIRST], steps=[])
    workflow["evaluate"] = [workflow["evaluate"][1]]
    workflow["select"] = {"objective": {"metric": "latency.p50_ms", "goal": "min"}}
    path = write_workflow(tmp_path, workflow)
    out_dir = tmp_path / "out"
    code = main(["run", str(path), "--store", str(tmp_path / "store"), "-o", str(out_dir), "-q"])
    assert code != 0  # nothing measured on the wrong device, so nothing chosen
    text = capsys.readouterr().out
    assert "AzureExecutionProvider" in text
    candidates = json.loads((out_dir / "candidates.json").read_text())
    assert "took no node" in json.dumps(candidates) and "allow_fallback" in json.dumps(candidates)


def test_allow_fallback_measures_and_records_placement(tmp_path, tiny_onnx, capsys):
    workflow = tiny_workflow(tiny_onnx, targets=[{**AZURE_FIRST, "allow_fallback": True}], steps=[])
    workflow["evaluate"] = [workflow["evaluate"][1]]
    workflow["select"] = {"objective": {"metric": "latency.p50_ms", "goal": "min"}}
    path = write_workflow(tmp_path, workflow)
    out_dir = tmp_path / "out"
    assert main(["run", str(path), "--store", str(tmp_path / "store"), "-o", str(out_dir), "-q"]) == 0
    candidates = json.dumps(json.loads((out_dir / "candidates.json").read_text()))
    assert '"placement": {"CPUExecutionProvider"' in candidates and '"ep_coverage": 0.0' in candidates
