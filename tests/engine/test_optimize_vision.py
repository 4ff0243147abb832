"""`engine optimize` on a Hugging Face vision folder: the task read from its config.json, the export
with pixel_values of its image processor's size, static QDQ INT8 calibrated on synthetic images
beside dynamic INT8; (slow) a real run whose chosen model loads in onnxruntime and keeps the
PyTorch model's logits."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from engine_helpers import engine_cmd

from engine.cli.main import main
from engine.workflow import load_workflow
from tests.vision_models import SIDE, tiny_vision


@pytest.fixture(scope="module")
def tiny_resnet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vision(tmp_path_factory.mktemp("models") / "tiny-resnet", "resnet")


def dry_run(model: Path, out: Path, *extra: str) -> dict[str, Any]:
    assert main(["optimize", str(model), "--device", "cpu", "--precision", "int8", *extra, "--dry-run", "-o", str(out)]) == 0
    load_workflow(out)
    return yaml.safe_load(out.read_text())


def test_a_vision_folder_gets_an_image_classification_export_and_static_int8(tiny_resnet: Path, tmp_path: Path) -> None:
    body = dry_run(tiny_resnet, tmp_path / "wf.yaml")
    steps = {step["id"]: step for step in body["steps"]}
    assert "task" not in body["input"]
    assert steps["export"]["pass"] == "torch_export" and steps["export"]["config"]["task"] == "image-classification"
    assert steps["int8"]["config"]["mode"] == "static" and steps["int8"]["config"]["calibration"] == "calibration"
    assert steps["int8_dynamic"]["config"] == {"mode": "dynamic"}
    assert "fuse" not in steps  # transformer fusion is for text encoders
    assert body["data"]["calibration"]["source"] == "synthetic" and body["data"]["heldout"]["source"] == "synthetic"
    assert body["evaluate"][-1]["config"]["batch_size"] == 1 and "sequence_length" not in body["evaluate"][-1]["config"]
    assert "vision model (image-classification)" in (tmp_path / "wf.yaml").read_text()


def test_a_vision_backbone_is_exported_for_feature_extraction(tmp_path: Path) -> None:
    model = tiny_vision(tmp_path / "vit", "vit", model_class="ViTModel")
    body = dry_run(model, tmp_path / "wf.yaml")
    assert body["steps"][0]["config"]["task"] == "feature-extraction"


def test_a_text_task_on_a_vision_model_exits_2_with_the_tasks_it_takes(tiny_resnet: Path, tmp_path: Path, capsys) -> None:
    code = main(["optimize", str(tiny_resnet), "--task", "text-classification", "--dry-run", "-o", str(tmp_path / "wf.yaml")])
    assert code == 2
    err = capsys.readouterr().err
    assert "does not apply to a vision model" in err and "image-classification" in err


@pytest.mark.slow
def test_optimizing_a_tiny_convnext_for_the_cpu_chooses_a_model_that_keeps_the_logits(tmp_path: Path) -> None:
    import onnxruntime
    import torch
    import transformers

    model = tiny_vision(tmp_path / "tiny-convnext", "convnext")
    env = {**os.environ, "KILN_STORE": str(tmp_path / "store")}
    args = [str(model), "--device", "cpu", "--precision", "int8", "--max-drop", "0.05", "-o", "wf.yaml", "-q"]
    done = subprocess.run([*engine_cmd(), "optimize", *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    output = tmp_path / "out" / "tiny-convnext-cpu-int8"
    candidates = json.loads((output / "candidates.json").read_text())["candidates"]
    assert len(candidates) == 4 and all(c["state"] == "complete" for c in candidates), candidates  # static QDQ calibrated too
    (chosen,) = [c for c in candidates if c["chosen"]]
    assert chosen["metrics"]["fidelity.cosine_mean"] >= 0.95
    files = sorted(output.rglob("model.onnx"))
    assert files, sorted(p.name for p in output.iterdir())
    pixels = np.random.default_rng(7).standard_normal((4, 3, SIDE, SIDE)).astype(np.float32)
    session = onnxruntime.InferenceSession(str(files[0]), providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], {"pixel_values": pixels})[0]
    reference = transformers.AutoModelForImageClassification.from_pretrained(str(model)).eval()
    with torch.no_grad():
        expected = reference(pixel_values=torch.from_numpy(pixels)).logits.numpy()
    cosine = (logits * expected).sum(-1) / (np.linalg.norm(logits, axis=-1) * np.linalg.norm(expected, axis=-1))
    assert logits.shape == expected.shape and cosine.min() >= 0.9, cosine
