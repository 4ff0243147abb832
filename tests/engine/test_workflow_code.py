"""A workflow can run code; `engine validate` and `engine plan` say which, and validating never
runs any: an input package is found without importing it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from engine_helpers import engine_cmd, tiny_workflow, write_workflow

from engine.workflow import load_workflow
from engine.workflow.code import code_of

EXAMPLES = Path(__file__).parents[2] / "workflows"


def custom_metric_workflow(tmp_path: Path, model: Path) -> Path:
    (tmp_path / "metric.py").write_text("def score(run, data):\n    return {'x': 1.0}\n")
    (tmp_path / "post.py").write_text("def postprocess_function(outputs):\n    return outputs\n")
    workflow = tiny_workflow(model)
    workflow["data"]["labelled"] = {"source": "sklearn", "name": "digits"}
    workflow["evaluate"].append(
        {"id": "mine", "evaluator": "custom", "config": {"file": "metric.py", "function": "score", "metrics": ["x"]}}
    )
    workflow["evaluate"].append({"id": "acc", "evaluator": "accuracy", "config": {"data": "labelled", "postprocess": "post.py"}})
    return write_workflow(tmp_path, workflow)


def test_custom_evaluator_files_and_postprocess_are_listed(tmp_path, tiny_onnx):
    uses = code_of(load_workflow(custom_metric_workflow(tmp_path, tiny_onnx)))
    assert [(u.where, u.file.name, u.function) for u in uses] == [
        ("evaluate[2].config.file", "metric.py", "score"),
        ("evaluate[3].config.postprocess", "post.py", None),
    ]
    assert all(u.file.is_absolute() for u in uses)


def test_a_torch_factory_is_listed():
    (use,) = code_of(load_workflow(EXAMPLES / "digits-cnn-cpu.yaml"))
    assert use.where == "input.factory" and use.file.name == "digits_cnn.py" and use.function == "build"


def test_a_workflow_without_code_lists_none(tmp_path, tiny_onnx):
    assert code_of(load_workflow(write_workflow(tmp_path, tiny_workflow(tiny_onnx)))) == []


def test_validate_and_plan_print_the_code_a_workflow_runs(tmp_path, tiny_onnx):
    path = custom_metric_workflow(tmp_path, tiny_onnx)
    for command in (["validate", str(path)], ["plan", str(path), "--store", str(tmp_path / "store")]):
        done = subprocess.run([*engine_cmd(), *command], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "runs code from 2 files" in done.stdout
        assert f"evaluate[2].config.file: {tmp_path / 'metric.py'}, function score" in done.stdout
        assert f"evaluate[3].config.postprocess: {tmp_path / 'post.py'}" in done.stdout


def test_validating_a_package_input_never_imports_the_package(tmp_path, tiny_onnx):
    package = tmp_path / "site" / "kiln_trap_model"
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("raise SystemExit('imported!')\n")
    (package / "model" / "model.onnx").write_bytes(tiny_onnx.read_bytes())
    workflow = tiny_workflow(tiny_onnx)
    workflow["input"] = {"format": "onnx", "package": "kiln_trap_model"}
    path = write_workflow(tmp_path, workflow)
    env_path = f"{tmp_path / 'site'}:{':'.join(sys.path[1:])}"
    done = subprocess.run(
        [*engine_cmd(), "validate", str(path)], capture_output=True, text=True, timeout=120, env={"PYTHONPATH": env_path, "PATH": ""}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "imported!" not in done.stdout + done.stderr
    assert "runs code" not in done.stdout


def test_a_package_input_resolves_to_its_model_folder(tmp_path, tiny_onnx, monkeypatch):
    package = tmp_path / "site" / "kiln_model_pkg"
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model" / "model.onnx").write_bytes(tiny_onnx.read_bytes())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    workflow = tiny_workflow(tiny_onnx)
    workflow["input"] = {"format": "onnx", "package": "kiln_model_pkg"}
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    assert resolved.input.path == package / "model"
    assert "kiln_model_pkg" not in sys.modules


def test_a_dotted_package_name_is_refused(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["input"] = {"format": "onnx", "package": "os.path"}
    done = subprocess.run([*engine_cmd(), "validate", str(write_workflow(tmp_path, workflow))], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "top-level import name" in done.stderr
