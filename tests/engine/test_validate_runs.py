"""What validates must run: every shape validate accepts is one the run can take, and every
shape the run cannot take is refused by validate, located."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import yaml
from engine_helpers import engine_cmd, tiny_workflow, write_workflow

from engine.core.errors import InputError
from engine.plan.planner import build_plan
from engine.workflow import load_workflow


def problems_of(path) -> list:
    with pytest.raises(InputError) as caught:
        load_workflow(path)
    return caught.value.problems


def test_a_dataset_without_a_source_is_refused(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["data"]["rows"].pop("source")
    problems = problems_of(write_workflow(tmp_path, workflow))
    problem = next(p for p in problems if p.where == "data.rows.source")
    assert "needs a source" in problem.message and "synthetic" in problem.expected
    assert problem.line is not None


def test_a_20000_step_chain_validates_and_plans_without_recursion(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx, data={}, steps=[])
    workflow["evaluate"] = [workflow["evaluate"][1]]
    workflow["select"]["constraints"] = []
    chain = "".join(f"- {{id: s{i}, pass: onnx_simplify, after: s{i - 1}, optional: {str(i == 1).lower()}}}\n" for i in range(1, 20_000))
    text = yaml.safe_dump(workflow, sort_keys=False).replace("steps: []\n", "steps:\n- {id: s0, pass: onnx_simplify}\n" + chain)
    path = tmp_path / "chain.yaml"
    path.write_text(text)
    started = time.monotonic()
    resolved = load_workflow(path)
    assert time.monotonic() - started < 10  # was 26 s, then a RecursionError in the run
    assert len(resolved.steps) == 20_000
    plan = build_plan(resolved, limit=1)
    assert len(plan.candidates_of("cpu")) == 1


def test_a_step_without_an_id_in_a_chain_is_reported(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [
        {"id": "a", "pass": "onnx_simplify"},
        {"pass": "onnx_simplify", "after": "a"},
        {"id": "c", "pass": "onnx_simplify", "after": "a"},
    ]
    problems = problems_of(write_workflow(tmp_path, workflow))
    assert [p.where for p in problems] == ["steps[1].id"]
    assert "missing" in problems[0].message


@pytest.mark.parametrize("section", ["steps", "evaluate", "targets"])
def test_a_list_as_an_id_is_reported(tmp_path, tiny_onnx, section):
    workflow = tiny_workflow(tiny_onnx)
    workflow[section][0]["id"] = ["a", "b"]
    problems = problems_of(write_workflow(tmp_path, workflow))
    assert f"{section}[0].id" in [p.where for p in problems]


@pytest.mark.parametrize(("fixed", "search"), [(3, [0, 1]), (5, {"low": 0, "high": 2})])
def test_a_fixed_value_outside_its_search_is_refused_naming_the_option(tmp_path, tiny_onnx, test_plugins, fixed, search):
    workflow = tiny_workflow(tiny_onnx)
    option = "per_channel" if fixed is True else "seconds"
    step = {
        "id": "a",
        "pass": "ort_quantize" if option == "per_channel" else "sleep",
        "config": {option: fixed},
        "search": {option: search},
    }
    workflow["steps"] = [step]
    problems = problems_of(write_workflow(tmp_path, workflow))
    problem = next(p for p in problems if p.where == f"steps[0].search.{option}")
    assert f"option '{option}' is fixed in config at {fixed!r}" in problem.message and "baselines" in problem.message
    assert problem.line is not None


@pytest.mark.parametrize("search", [[False], {"values": [False]}, [True]])
def test_a_fixed_option_searched_over_a_single_value_is_refused_whatever_the_value(tmp_path, tiny_onnx, search):
    """Fixed at False and searched over [False] (or [True]): one of the two is a mistake, said at once with exit 2."""
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [{"id": "a", "pass": "ort_quantize", "config": {"per_channel": False}, "search": {"per_channel": search}}]
    path = write_workflow(tmp_path, workflow)
    problem = next(p for p in problems_of(path) if p.where == "steps[0].search.per_channel")
    assert "fixed in config at False and searched over the single value" in problem.message
    assert problem.expected and problem.given and problem.hint and problem.line is not None
    result = subprocess.run([*engine_cmd(), "validate", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "steps[0].search.per_channel" in result.stderr and "Traceback" not in result.stderr


def test_a_target_setting_fixed_and_searched_over_its_own_value_is_refused(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["targets"][0]["search"] = {"intra_op_threads": [1]}
    problem = next(p for p in problems_of(write_workflow(tmp_path, workflow)) if p.where == "targets[0].search.intra_op_threads")
    assert "searched over the single value" in problem.message


def test_a_fixed_value_among_its_searched_values_is_the_baselines_value(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [{"id": "a", "pass": "sleep", "config": {"seconds": 0}, "search": {"seconds": {"low": 0, "high": 2}}}]
    plan = build_plan(load_workflow(write_workflow(tmp_path, workflow)))
    assert {"a.seconds": 0} in [c.params for c in plan.baselines("cpu")]


def test_duplicate_keys_are_refused_in_yaml_and_json(tmp_path, tiny_onnx):
    text = yaml.safe_dump(tiny_workflow(tiny_onnx), sort_keys=False).replace(
        "  pass: ort_quantize\n", "  pass: ort_quantize\n  pass: fp16\n"
    )
    (tmp_path / "dup.yaml").write_text(text)
    (problem,) = problems_of(tmp_path / "dup.yaml")
    assert problem.where == "steps[0].pass" and "appears twice" in problem.message
    assert text.splitlines()[problem.line - 1].strip() == "pass: fp16"
    body = json.dumps(tiny_workflow(tiny_onnx), indent=1).replace('"pass": "ort_quantize"', '"pass": "ort_quantize", "pass": "fp16"')
    (tmp_path / "dup.json").write_text(body)
    (problem,) = problems_of(tmp_path / "dup.json")
    assert "appears twice" in problem.message and problem.line is not None


@pytest.mark.parametrize("bound", [".nan", ".inf", "-.inf"])
def test_a_nan_or_infinite_bound_is_refused(tmp_path, tiny_onnx, bound):
    text = yaml.safe_dump(tiny_workflow(tiny_onnx), sort_keys=False).replace("min: 0.9", f"min: {bound}")
    (tmp_path / "nan.yaml").write_text(text)
    (problem,) = problems_of(tmp_path / "nan.yaml")
    assert problem.where == "select.constraints[0].min"
    assert "not a usable number" in problem.message


def test_a_nan_bound_is_refused_in_json_too(tmp_path, tiny_onnx):
    body = json.dumps(tiny_workflow(tiny_onnx)).replace('"min": 0.9', '"min": NaN')
    (tmp_path / "nan.json").write_text(body)
    (problem,) = problems_of(tmp_path / "nan.json")
    assert "NaN is not a usable number" in problem.message


@pytest.mark.parametrize(
    ("section", "option", "value"),
    [
        ("targets", "intra_op_threads", 2**64 - 1),
        ("targets", "intra_op_threads", 2**40),
        ("evaluate", "runs", 1e30),
        ("evaluate", "runs", 2**40),
    ],
)
def test_numbers_have_upper_bounds(tmp_path, tiny_onnx, section, option, value):
    workflow = tiny_workflow(tiny_onnx)
    entry = workflow[section][0] if section == "targets" else workflow[section][1]["config"]
    entry[option] = value
    problems = problems_of(write_workflow(tmp_path, workflow))
    assert len(problems) == 1 and problems[0].where.endswith(option), problems


def test_workflow_level_numbers_have_upper_bounds(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx, search={"seed": 2**40, "max_candidates": 10**9, "max_time_s": 1e12})
    problems = problems_of(write_workflow(tmp_path, workflow))
    assert sorted(p.where for p in problems) == ["search.max_candidates", "search.max_time_s", "search.seed"]


def test_a_text_file_named_onnx_is_refused(tmp_path, tiny_onnx):
    fake = tmp_path / "fake.onnx"
    fake.write_text("this is not a model\n")
    (problem,) = problems_of(write_workflow(tmp_path, tiny_workflow(fake)))
    assert problem.where == "input.path" and "not an ONNX model" in problem.message


def test_an_empty_onnx_file_is_refused(tmp_path):
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    (problem,) = problems_of(write_workflow(tmp_path, tiny_workflow(empty)))
    assert problem.where == "input.path" and "empty" in problem.message


def test_a_fifo_named_onnx_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    started = time.monotonic()
    (problem,) = problems_of(write_workflow(tmp_path, tiny_workflow(fifo)))
    assert time.monotonic() - started < 1
    assert problem.where == "input.path" and "FIFO" in problem.message


def test_a_truncated_onnx_file_is_refused(tmp_path, tiny_onnx):
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(tiny_onnx.read_bytes()[:200])
    (problem,) = problems_of(write_workflow(tmp_path, tiny_workflow(cut)))
    assert "not an ONNX model" in problem.message


def test_the_cli_refuses_a_bad_model_with_exit_2(tmp_path):
    fake = tmp_path / "fake.onnx"
    fake.write_text("hello")
    done = subprocess.run(
        [*engine_cmd(), "validate", str(write_workflow(tmp_path, tiny_workflow(fake)))], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr and "not an ONNX model" in done.stderr
