"""Bad input gets one clear message per problem, with file, line, key path, expected, given and a
fix; the CLI exits 2 without a traceback and writes nothing to the store."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from engine_helpers import engine_cmd, tiny_workflow, write_workflow

from engine.core.errors import InputError
from engine.workflow import load_workflow


def problems_of(path: Path) -> list:
    with pytest.raises(InputError) as caught:
        load_workflow(path)
    return caught.value.problems


def test_valid_tiny_workflow_resolves(tmp_path, tiny_onnx):
    resolved = load_workflow(write_workflow(tmp_path, tiny_workflow(tiny_onnx)))
    assert list(resolved.steps) == ["int8"]
    assert resolved.steps["int8"].config["per_channel"] is False  # defaults filled in
    assert resolved.targets["cpu"].availability.ok


def test_malformed_yaml_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("version: 1\nname: x\nsteps:\n  - id: a\n    pass: [unclosed\n")
    (problem,) = problems_of(path)
    assert "malformed YAML" in problem.message
    assert problem.line is not None and problem.line >= 5
    assert problem.file == str(path)


def test_malformed_json_names_the_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "version": 1,\n  "name": "x",\n}\n')
    (problem,) = problems_of(path)
    assert "malformed JSON" in problem.message
    assert problem.line == 4


def test_unknown_top_level_key_suggests_the_close_one(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["evalute"] = workflow.pop("evaluate")
    problems = problems_of(write_workflow(tmp_path, workflow))
    unknown = [p for p in problems if "unknown key 'evalute'" in p.message]
    assert unknown and unknown[0].hint == "did you mean 'evaluate'?"
    assert unknown[0].line is not None


def test_unknown_pass_suggests_the_close_one(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"][0]["pass"] = "ort_quantise"
    path = write_workflow(tmp_path, workflow)
    (problem,) = problems_of(path)
    assert problem.where == "steps[0].pass"
    assert problem.given == "ort_quantise"
    assert problem.hint == "did you mean 'ort_quantize'?"
    assert "pass: ort_quantise" in path.read_text().splitlines()[problem.line - 1]


def test_option_of_the_wrong_type_says_what_was_expected(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"][0]["config"]["per_channel"] = "sometimes"
    (problem,) = problems_of(write_workflow(tmp_path, workflow))
    assert problem.where == "steps[0].config.per_channel"
    assert "pass 'ort_quantize'" in problem.message
    assert problem.given == '"sometimes"'


def test_misspelled_option_suggests_the_close_one(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"][0]["config"]["per_chanel"] = True
    (problem,) = problems_of(write_workflow(tmp_path, workflow))
    assert problem.where == "steps[0].config.per_chanel"
    assert problem.hint == "did you mean 'per_channel'?"


def test_search_over_an_unknown_option_is_an_error(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"][0]["search"] = {"per_chanel": [True, False]}
    (problem,) = problems_of(write_workflow(tmp_path, workflow))
    assert problem.where == "steps[0].search.per_chanel"
    assert problem.hint == "did you mean 'per_channel'?"


def test_after_naming_a_missing_step_suggests_one(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"].append({"id": "again", "pass": "ort_quantize", "after": "int9"})
    problems = problems_of(write_workflow(tmp_path, workflow))
    assert [p.where for p in problems] == ["steps[1].after"]
    assert problems[0].hint == "did you mean 'int8'?"


def test_a_cycle_is_reported_with_its_steps(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [
        {"id": "a", "pass": "ort_quantize", "after": "b"},
        {"id": "b", "pass": "ort_quantize", "after": "a"},
    ]
    problems = problems_of(write_workflow(tmp_path, workflow))
    assert any("cycle" in p.message and "a" in p.message and "b" in p.message for p in problems)


def test_missing_input_path_is_reported(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tmp_path / "nowhere.onnx")
    (problem,) = problems_of(write_workflow(tmp_path, workflow))
    assert problem.where == "input.path"
    assert "does not exist" in problem.message


def test_model_folder_without_weights_is_reported(tmp_path, tiny_onnx):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    workflow = tiny_workflow(tiny_onnx, input={"format": "hf", "path": str(folder)})
    workflow["steps"] = [{"id": "export", "pass": "torch_export"}]
    (problem,) = problems_of(write_workflow(tmp_path, workflow))
    assert "no weights" in problem.message
    assert "model.safetensors" in problem.expected


def test_unknown_runtime_is_an_error(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx, targets=[{"id": "t", "runtime": "onnxruntim"}])
    problems = problems_of(write_workflow(tmp_path, workflow))
    assert any(p.where == "targets[0].runtime" and p.hint == "did you mean 'onnxruntime'?" for p in problems)


def test_a_provider_missing_here_makes_the_target_unavailable_not_invalid(tmp_path, tiny_onnx):
    workflow = tiny_workflow(
        tiny_onnx, targets=[{"id": "gpu", "runtime": "onnxruntime", "device": "cuda", "providers": ["CUDAExecutionProvider"]}]
    )
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    availability = resolved.targets["gpu"].availability
    assert not availability.ok
    assert "CUDAExecutionProvider" in availability.reason


def test_unknown_metric_in_select_suggests_one(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["select"]["objective"]["metric"] = "latency.p50"
    (problem,) = problems_of(write_workflow(tmp_path, workflow))
    assert problem.where == "select.objective.metric"
    assert problem.hint == "did you mean 'latency.p50_ms'?"


def test_undeclared_dataset_is_reported(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["evaluate"][0]["config"]["data"] = "row"
    (problem,) = problems_of(write_workflow(tmp_path, workflow))
    assert problem.where == "evaluate[0].config.data"
    assert problem.hint == "did you mean 'rows'?"


def test_pass_that_cannot_take_the_input_format_is_reported(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [{"id": "export", "pass": "torch_export"}]
    (problem,) = problems_of(write_workflow(tmp_path, workflow))
    assert problem.where == "steps[0].pass"
    assert "cannot take a onnx model" in problem.message


def test_all_problems_are_reported_at_once(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["colour"] = "blue"
    workflow["steps"][0]["pass"] = "nope"
    workflow["evaluate"][1]["config"]["runs"] = "many"
    problems = problems_of(write_workflow(tmp_path, workflow))
    assert {p.where for p in problems} >= {"colour", "steps[0].pass", "evaluate[1].config.runs"}


def test_json_and_yaml_workflows_are_equivalent(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    json_path = tmp_path / "w.json"
    json_path.write_text(json.dumps(workflow, indent=2))
    yaml_path = write_workflow(tmp_path, workflow)
    assert load_workflow(json_path).spec == load_workflow(yaml_path).spec


def test_json_problems_carry_lines(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"][0]["pass"] = "ort_quantise"
    path = tmp_path / "w.json"
    path.write_text(json.dumps(workflow, indent=2))
    (problem,) = problems_of(path)
    line = path.read_text().splitlines()[problem.line - 1]
    assert '"pass"' in line


def test_cli_exits_2_with_no_traceback_and_writes_nothing(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"][0]["pass"] = "ort_quantise"
    path = write_workflow(tmp_path, workflow)
    store = tmp_path / "store"
    for command in (["validate", str(path)], ["run", str(path), "--store", str(store), "-o", str(tmp_path / "out")]):
        wide = {**os.environ, "COLUMNS": "1000"}  # each problem's first line whole, however long the path
        done = subprocess.run([*engine_cmd(), *command], capture_output=True, text=True, timeout=120, env=wide)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "ort_quantise" in text)
        assert f"{path}:{line}: steps[0].pass: unknown pass 'ort_quantise'" in done.stderr
        assert "did you mean 'ort_quantize'?" in done.stderr
    assert not store.exists()
    assert not (tmp_path / "out").exists()


def test_select_cannot_use_an_evaluation_that_candidates_do_not_get(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["evaluate"][0]["candidates"] = False
    (problem,) = problems_of(write_workflow(tmp_path, workflow))
    assert problem.where == "select.constraints[0].metric"


@pytest.mark.parametrize("confidence", [0, 1, 1.5, -0.2, ".nan"])
def test_a_confidence_outside_zero_one_is_refused_with_its_location(tmp_path, tiny_onnx, confidence):
    workflow = tiny_workflow(tiny_onnx)
    workflow["select"]["confidence"] = float("nan") if confidence == ".nan" else confidence
    problems = problems_of(write_workflow(tmp_path, workflow))
    (problem,) = [p for p in problems if p.where == "select.confidence"]
    assert problem.line is not None


def test_an_unknown_tie_break_metric_is_refused_with_a_suggestion(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["select"]["tie_break"] = ["size", {"metric": "fidelity.cosine_maen", "goal": "max"}]
    (problem,) = problems_of(write_workflow(tmp_path, workflow))
    assert problem.message == "unknown metric 'fidelity.cosine_maen'"
    assert problem.where == "select.tie_break[1].metric"
    assert problem.hint == "did you mean 'fidelity.cosine_mean'?"


def test_an_unknown_tie_break_rule_is_refused(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["select"]["tie_break"] = ["smallest"]
    problems = problems_of(write_workflow(tmp_path, workflow))
    assert any(p.where.startswith("select.tie_break[0]") for p in problems)


@pytest.mark.parametrize(
    ("option", "value"),
    [("precision", 0), ("precision", -0.01), ("max_time_s", 0), ("confidence", 1.2), ("busy_cores", 0), ("min_rounds", 1)],
)
def test_bad_latency_comparison_options_exit_2_with_the_key_path(tmp_path, tiny_onnx, option, value):
    workflow = tiny_workflow(tiny_onnx)
    workflow["evaluate"][1]["config"][option] = value
    path = write_workflow(tmp_path, workflow)
    done = subprocess.run([*engine_cmd(), "validate", str(path)], capture_output=True, text=True)
    assert done.returncode == 2
    assert f"evaluate[1].config.{option}" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def test_an_input_folder_with_a_device_in_it_exits_2_naming_the_key_and_the_file(tmp_path):
    import os
    import subprocess

    from engine_helpers import engine_cmd, tiny_workflow, write_workflow

    model = tmp_path / "model"
    model.mkdir()
    os.symlink("/dev/zero", model / "model.onnx")  # hashing it would read forever
    path = write_workflow(tmp_path, tiny_workflow(model))
    done = subprocess.run(
        [*engine_cmd(), "plan", str(path), "--store", str(tmp_path / "store")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "input.path" in done.stderr and "character device" in done.stderr and str(path) in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("margin", [-0.1, 1, 3])
def test_a_tie_margin_outside_zero_one_is_refused(tmp_path, tiny_onnx, margin):
    workflow = tiny_workflow(tiny_onnx)
    workflow["select"]["tie_within"] = margin
    problems = problems_of(write_workflow(tmp_path, workflow))
    assert [p.where for p in problems] == ["select.tie_within"]
