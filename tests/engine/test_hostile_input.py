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
