"""Hostile workflow input is refused with exit 2 (file, key path, expected, given, fix), never
exit 3: paths the engine cannot read, search spaces too large to list, values of the wrong type."""

from __future__ import annotations

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


def engine(*args: str, timeout: int = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*engine_cmd(), *args], capture_output=True, text=True, timeout=timeout)


def assert_refused(done: subprocess.CompletedProcess[str], *needles: str) -> str:
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output and "bug in Kiln" not in output
    for needle in needles:
        assert needle in output, output
    return output


def test_a_symlink_loop_as_input_path_is_refused_by_validate_and_run(tmp_path):
    loop = tmp_path / "loop.onnx"
    os.symlink(loop, loop)
    path = write_workflow(tmp_path, tiny_workflow(loop))
    for command in ("validate", "run"):
        output = assert_refused(engine(command, str(path)), "input.path", "symlink loop", "expected:", "fix:")
        assert str(path) in output


def test_a_symlink_loop_as_factory_file_is_refused(tmp_path, tiny_onnx):
    loop = tmp_path / "make.py"
    os.symlink(loop, loop)
    workflow = tiny_workflow(tiny_onnx)
    workflow["input"] = {"format": "torch", "factory": "make.py:build"}
    (problem,) = [p for p in problems_of(write_workflow(tmp_path, workflow)) if p.where.startswith("input")]
    assert problem.where == "input.factory" and "symlink loop" in problem.message


@pytest.mark.parametrize("kind", ["loop", "fifo", "/dev/zero", "/dev/urandom"])
def test_a_data_path_that_is_no_regular_file_is_refused_alike_by_validate_and_plan(tmp_path, tiny_onnx, kind):
    if kind == "loop":
        data = tmp_path / "rows.jsonl"
        os.symlink(data, data)
    elif kind == "fifo":
        data = tmp_path / "rows.jsonl"
        os.mkfifo(data)
    else:
        data = Path(kind)
    workflow = tiny_workflow(tiny_onnx)
    workflow["data"] = {"rows": {"source": "jsonl", "path": str(data), "text_column": "text"}}
    path = write_workflow(tmp_path, workflow)
    outputs = [
        assert_refused(engine(command, str(path), timeout=30), "data.rows.path", "expected:", "given:", "fix:")
        for command in ("validate", "plan")
    ]
    assert "symlink loop" in outputs[0] if kind == "loop" else "not a regular file or a folder" in outputs[0]
    assert outputs[0].splitlines()[1:] == outputs[1].splitlines()[1:]  # one gate, one answer


def test_a_folder_as_the_workflow_path_is_refused(tmp_path):
    folder = tmp_path / "workflow.yaml"
    folder.mkdir()
    for command in ("validate", "plan"):
        assert_refused(engine(command, str(folder)), "is a directory", "fix:")


def _huge_step_search(model: Path, points: int, cap: int | None) -> dict:
    workflow = tiny_workflow(model)
    workflow["steps"][0]["config"] = {"mode": "static", "calibration": "rows"}
    workflow["steps"][0]["search"] = {"num_bins": {"low": 2, "high": points + 1}}
    if cap is not None:
        workflow["search"] = {"max_candidates": cap}
    return workflow


def test_a_huge_step_range_with_max_candidates_is_sized_and_planned_without_being_listed(tmp_path, tiny_onnx):
    import time

    from engine.plan.planner import build_plan

    path = write_workflow(tmp_path, _huge_step_search(tiny_onnx, 10**12, 3))
    started = time.monotonic()
    plan = build_plan(load_workflow(path))
    assert plan.spaces["cpu"].size() == 10**12
    assert len(plan.candidates_of("cpu")) == 3
    assert any("1,000,000,000,000 points" in note for note in plan.dropped)
    assert time.monotonic() - started < 10


def test_a_huge_target_range_is_refused_with_exit_2(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    del workflow["targets"][0]["intra_op_threads"]
    workflow["targets"][0]["search"] = {"intra_op_threads": {"low": 1, "high": 10**12, "step": 1}}
    path = write_workflow(tmp_path, workflow)
    assert_refused(engine("validate", str(path)), "targets[0].search.intra_op_threads")


def test_a_grid_larger_than_the_bound_without_max_candidates_is_refused_by_validate_and_plan(tmp_path, tiny_onnx):
    path = write_workflow(tmp_path, _huge_step_search(tiny_onnx, 10**7, None))
    for command in ("validate", "plan"):
        assert_refused(engine(command, str(path)), "search.sampler", "10,000,000 points", "expected:", "max_candidates")


def test_the_size_of_a_conditional_space_is_counted_as_its_points_are_listed():
    from engine.core.search import Categorical, IntRange, SearchDim, grid_points, grid_size

    dims = {
        "mode": SearchDim(Categorical(("a", "b", "c"))),
        "n": SearchDim(IntRange(1, 7, 2), {"mode": ["a", "c"]}),
        "flag": SearchDim(Categorical((False, True)), {"n": 3}),
        "other": SearchDim(IntRange(0, 4), {"mode": "b"}),
        "free": SearchDim(Categorical((1, 2))),
    }
    for base in ({}, {"mode": "a"}):
        assert grid_size(dims, base) == len(grid_points(dims, base))
    assert grid_size({"x": SearchDim(IntRange(0, 10**12 - 1))}, {}) == 10**12
    assert grid_points({"x": SearchDim(IntRange(0, 10**12 - 1))}, {}, limit=2) == [{"x": 0}, {"x": 1}]


def test_plan_creates_nothing_on_disk_not_even_the_store(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["cache"] = {"dir": "cache/store"}
    path = write_workflow(tmp_path / "flow", workflow)
    before = sorted(tmp_path.rglob("*"))
    done = engine("plan", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(tmp_path.rglob("*")) == before


def _refused_at(tmp_path: Path, workflow: dict, where: str, name: str = "workflow.yaml"):
    problems = problems_of(write_workflow(tmp_path, workflow, name))
    found = [p for p in problems if p.where == where]
    assert found, [(p.where, p.message) for p in problems]
    return found[0]


@pytest.mark.parametrize("version", [True, 1.0, "1"])
def test_the_version_is_the_integer_1(tmp_path, tiny_onnx, version):
    assert "integer 1" in _refused_at(tmp_path, tiny_workflow(tiny_onnx, version=version), "version").message or version == "1"


def test_a_constraint_whose_min_is_above_its_max_is_refused(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["select"]["constraints"] = [{"metric": "fidelity.cosine_mean", "min": 10, "max": 1}]
    assert "min 10 is above max 1" in _refused_at(tmp_path, workflow, "select.constraints[0]").message


def test_a_range_on_a_bool_option_is_refused(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"][0]["search"] = {"per_channel": {"low": 0, "high": 1}}
    problem = _refused_at(tmp_path, workflow, "steps[0].search.per_channel")
    assert "bool" in problem.message and problem.expected and problem.hint


@pytest.mark.parametrize("listed", ["list", "values"])
def test_a_value_listed_twice_is_refused_naming_it(tmp_path, tiny_onnx, listed):
    workflow = tiny_workflow(tiny_onnx)
    values = [False] * 1000 + [True]
    workflow["steps"][0]["search"] = {"per_channel": values if listed == "list" else {"values": values}}
    where = "steps[0].search.per_channel" + (".values" if listed == "values" else "")
    assert "False is listed 1000 times" in _refused_at(tmp_path, workflow, where).message


def test_a_byte_order_mark_is_read_past_in_json_and_yaml(tmp_path, tiny_onnx):
    import json

    import yaml

    workflow = tiny_workflow(tiny_onnx)
    for name, text in (("w.json", json.dumps(workflow)), ("w.yaml", yaml.safe_dump(workflow))):
        path = tmp_path / name
        path.write_text("\ufeff" + text, encoding="utf-8")
        assert load_workflow(path).name == "tiny"


@pytest.mark.parametrize("section", ["steps", "evaluate", "targets"])
def test_every_id_stops_at_64_characters(tmp_path, tiny_onnx, section):
    workflow = tiny_workflow(tiny_onnx)
    workflow[section][0]["id"] = "a" * 65
    if section == "steps":
        workflow["steps"][0]["id"] = "a" * 65
    _refused_at(tmp_path, workflow, f"{section}[0].id")
    workflow[section][0]["id"] = "a" * 64
    problems = [p for p in _problems_or_none(write_workflow(tmp_path, workflow)) if p.where == f"{section}[0].id"]
    assert not problems


def _problems_or_none(path: Path) -> list:
    try:
        load_workflow(path)
    except InputError as error:
        return error.problems
    return []


def test_a_value_of_the_wrong_type_says_what_is_expected_and_the_fix(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"][0]["config"]["per_channel"] = "sometimes"
    problem = _refused_at(tmp_path, workflow, "steps[0].config.per_channel")
    assert problem.expected == "true or false" and problem.given == '"sometimes"' and problem.hint


def test_a_searched_value_of_the_wrong_type_gets_a_type_fix_not_a_narrowing_one(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"][0]["search"] = {"per_channel": [False, 3]}
    problem = _refused_at(tmp_path, workflow, "steps[0].search.per_channel")
    assert problem.expected == "true or false" and problem.given == "3"
    assert "must be true or false" in problem.hint and "when:" not in problem.hint


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda w: w["steps"][0]["config"].update(per_channel="true"), "steps[0].config.per_channel"),
        (lambda w: w["steps"][0].update(search={"per_channel": ["yes", "no"]}), "steps[0].search.per_channel"),
        (lambda w: w["steps"][0].update(optional=1), "steps[0].optional"),
        (lambda w: w["evaluate"][0].update(candidates="false"), "evaluate[0].candidates"),
    ],
)
def test_a_boolean_option_takes_true_or_false_only(tmp_path, tiny_onnx, change, where):
    """pydantic's lax mode reads "true", "yes" and 1 as booleans: a workflow's are refused, in a
    step's config, its search, and the workflow's own keys."""
    workflow = tiny_workflow(tiny_onnx)
    change(workflow)
    [problem] = problems_of(write_workflow(tmp_path, workflow))
    assert problem.where == where
    assert problem.expected == "true or false"
    assert "true or false" in (problem.hint or "")


def test_tokenizer_input_on_an_onnx_input_is_refused_at_validate_time(tmp_path, tiny_onnx):
    (tmp_path / "lines.txt").write_text("one line\nanother line\n")
    workflow = tiny_workflow(tiny_onnx)
    workflow["data"] = {"rows": {"source": "text_lines", "path": str(tmp_path / "lines.txt"), "tokenizer": "input"}}
    [problem] = problems_of(write_workflow(tmp_path, workflow))
    assert problem.where == "data.rows.tokenizer"
    assert "an onnx input has none" in problem.message and "tokenizer:" in (problem.hint or "")
