"""A workflow over a Hugging Face vision folder that gives no task: the task read from config.json,
the export, dynamic INT8, and fidelity measured on PNG / JPEG images prepared by the model's own
image processor (image_folder with processor: input)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_helpers import write_workflow

from engine.cli.main import main
from tests.vision_models import tiny_vision, write_images


@pytest.mark.slow
def test_a_vit_folder_is_exported_quantized_and_measured_on_images(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tiny_vision(tmp_path / "tiny-vit", "vit")
    images = write_images(tmp_path / "images", classes=2, per_class=4)
    workflow = {
        "version": 1,
        "name": "vit",
        "input": {"format": "hf", "path": str(model)},
        "data": {"images": {"source": "image_folder", "path": str(images), "processor": "input"}},
        "targets": [{"id": "cpu", "runtime": "onnxruntime", "intra_op_threads": 1}],
        "steps": [
            {"id": "export", "pass": "torch_export"},
            {"id": "int8", "pass": "ort_quantize", "after": "export", "config": {"mode": "dynamic"}},
        ],
        "evaluate": [{"id": "fidelity", "evaluator": "fidelity", "config": {"data": "images"}}, {"id": "size", "evaluator": "size"}],
        "select": {
            "objective": {"metric": "size.file_bytes", "goal": "min"},
            "constraints": [{"metric": "fidelity.cosine_mean", "min": 0.9}],
        },
        "cache": {"dir": str(tmp_path / "store")},
        "output": {"dir": str(tmp_path / "out")},
    }
    file = write_workflow(tmp_path, workflow)
    assert main(["run", str(file)]) == 0, capsys.readouterr().err
    candidates = json.loads((tmp_path / "out" / "candidates.json").read_text())["candidates"]
    assert all(c["state"] == "complete" for c in candidates), candidates
    int8 = next(c for c in candidates if c["path"].endswith("int8"))
    assert int8["metrics"]["fidelity.samples"] == 8 and 0.9 <= int8["metrics"]["fidelity.cosine_mean"] < 1.0
    export = json.loads(next((tmp_path / "out").rglob("workflow.lock.json")).read_text())
    assert "image-classification" in json.dumps(export)
