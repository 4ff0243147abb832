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

    from engine.planner import build_plan

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
