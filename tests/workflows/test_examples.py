"""Every example workflow validates; the main one runs end to end on the real model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.workflow import load_workflow

WORKFLOWS = Path(__file__).resolve().parents[2] / "workflows"
EXAMPLES = sorted(p for p in WORKFLOWS.iterdir() if p.suffix in (".yaml", ".yml", ".json"))


def test_there_are_examples():
    assert any(p.name == "bert-cpu.yaml" for p in EXAMPLES)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_workflow_is_valid(path):
    resolved = load_workflow(path)
    assert resolved.steps and resolved.evaluators


def _run(workflow: Path, store: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", "run", str(workflow), "--store", str(store), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=1800,
    )


@pytest.mark.slow
def test_bert_cpu_chooses_per_channel_int8_then_reruns_from_the_cache(tmp_path):
    store, out = tmp_path / "store", tmp_path / "out"
    first = _run(WORKFLOWS / "bert-cpu.yaml", store, out)
    assert first.returncode == 0, first.stdout + first.stderr
    records = {c["path"]: c for c in json.loads((out / "candidates.json").read_text())["candidates"]}
    fp32 = records["export"]
    per_tensor = records["export → int8(per_channel=false)"]
    per_channel = records["export → int8(per_channel=true)"]
    assert fp32["reference"] and fp32["metrics"]["fidelity.cosine_mean"] == 1.0
    assert per_tensor["feasible"] is False and "fidelity.cosine_mean" in per_tensor["violations"][0]
    assert per_channel["chosen"], first.stdout
    assert per_channel["metrics"]["latency.p50_ms"] < fp32["metrics"]["latency.p50_ms"]
    export_details = per_channel["steps"][0]["details"]
    assert export_details["parity"]["max_abs_diff"] <= export_details["parity"]["tolerance"]
    import onnxruntime

    session = onnxruntime.InferenceSession(str(out / "ort-cpu" / "model" / "model.onnx"), providers=["CPUExecutionProvider"])
    assert {i.name for i in session.get_inputs()} >= {"input_ids", "attention_mask"}

    second = _run(WORKFLOWS / "bert-cpu.yaml", store, out)
    assert second.returncode == 0
    assert "passes: 0 run" in second.stdout and "evaluations: 0 run" in second.stdout


@pytest.mark.slow
def test_digits_cnn_holds_int8_to_the_heldout_accuracy(tmp_path):
    store, out = tmp_path / "store", tmp_path / "out"
    done = _run(WORKFLOWS / "digits-cnn-cpu.yaml", store, out)
    assert done.returncode == 0, done.stdout + done.stderr
    records = json.loads((out / "candidates.json").read_text())["candidates"]
    reference = next(c for c in records if c["reference"])
    assert reference["metrics"]["accuracy.top1"] >= 0.9  # the factory really trained the CNN
    assert reference["metrics"]["accuracy.samples"] == 597  # only the held-out digits
    static = [c for c in records if c["path"].startswith("export → static_int8")]
    assert len(static) == 10  # 2 MinMax + 4 Entropy + 4 Percentile points
    for candidate in records:
        if candidate["state"] == "complete" and candidate["feasible"]:
            assert reference["metrics"]["accuracy.top1"] - candidate["metrics"]["accuracy.top1"] <= 0.01
    chosen = next(c for c in records if c["chosen"])
    assert chosen["metrics"]["latency.p50_ms"] <= reference["metrics"]["latency.p50_ms"]
