"""Hostile workflow files are refused quickly, with a located message and exit 2: deep nesting,
recursive anchors, alias bombs, huge integers, odd paths, FIFOs, devices and huge files."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from engine_helpers import engine_cmd, tiny_workflow, write_workflow

from engine.core.errors import InputError
from engine.workflow import load_workflow, read_workflow


def refused(path: Path, seconds: float = 1.0) -> list:
    started = time.monotonic()
    with pytest.raises(InputError) as caught:
        load_workflow(path)
    assert time.monotonic() - started < seconds
    return caught.value.problems


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["deep.yaml", "deep.json"])
def test_nesting_past_the_recursion_limit_is_refused(tmp_path, name):
    path = write(tmp_path, name, "[" * 100_000 + "]" * 100_000)
    (problem,) = refused(path)
    assert "nested deeper than" in problem.message
    assert problem.line == 1


def test_deep_block_yaml_is_refused_at_its_line(tmp_path):
    text = "version: 1\n" + "".join("  " * level + f"k{level}:\n" for level in range(200))
    (problem,) = refused(write(tmp_path, "deep.yaml", text))
    assert "nested deeper than" in problem.message
    assert problem.line is not None and problem.line > 30


def test_a_recursive_anchor_is_refused(tmp_path):
    (problem,) = refused(write(tmp_path, "loop.yaml", "version: 1\nname: &a [1, *a]\n"))
    assert "alias '*a'" in problem.message
    assert problem.line == 2


def test_a_billion_laughs_is_refused_quickly(tmp_path):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    (problem,) = refused(write(tmp_path, "bomb.yaml", "\n".join(lines) + "\n"))
    assert "aliases expand to more than" in problem.message
    assert problem.line is not None


def test_aliases_that_share_a_block_still_work(tmp_path, tiny_onnx):
    text = yaml.safe_dump(tiny_workflow(tiny_onnx), sort_keys=False)
    text = text.replace("  config:\n    mode: dynamic\n", "  config: &shared\n    mode: dynamic\n", 1)
    text = text.replace("evaluate:\n", "- id: int8b\n  pass: ort_quantize\n  config: *shared\nevaluate:\n", 1)
    resolved = load_workflow(write(tmp_path, "anchors.yaml", text))
    assert resolved.steps["int8b"].config["mode"] == "dynamic"


@pytest.mark.parametrize("name", ["big.yaml", "big.json"])
def test_an_integer_of_thousands_of_digits_is_refused(tmp_path, name):
    text = '{"version": 1,\n "name": ' + "9" * 5000 + "}"
    (problem,) = refused(write(tmp_path, name, text))
    assert "an integer of 5,000 digits" in problem.message
    assert problem.line == 2


def test_an_integer_past_64_bits_is_refused_where_it_stands(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["search"] = {"seed": 2**70}
    problems = refused(write_workflow(tmp_path, workflow))
    assert [p.where for p in problems] == ["search.seed"]
    assert "out of range" in problems[0].message


@pytest.mark.parametrize("name", ["dup.yaml", "dup.json"])
def test_a_key_given_twice_is_refused(tmp_path, name):
    text = '{"version": 1,\n "name": "a",\n "name": "b"}'
    (problem,) = refused(write(tmp_path, name, text))
    assert "key 'name' appears twice" in problem.message
    assert problem.line in (2, 3)


def test_yaml_tags_are_refused(tmp_path):
    (problem,) = refused(write(tmp_path, "tag.yaml", "version: 1\nname: !!python/object:os.system x\n"))
    assert "YAML tags" in problem.message and problem.line == 2


def test_a_fifo_workflow_is_refused_without_blocking(tmp_path):
    path = tmp_path / "pipe.yaml"
    os.mkfifo(path)
    (problem,) = refused(path)
    assert "FIFO" in problem.message


def test_dev_zero_behind_a_workflow_name_is_refused(tmp_path):
    path = tmp_path / "zero.yaml"
    path.symlink_to("/dev/zero")
    (problem,) = refused(path)
    assert "not a regular file" in problem.message


def test_a_huge_workflow_file_is_refused_unread(tmp_path):
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as handle:
        handle.truncate(10 * 1024**3)  # sparse: 10 GiB that take no room
    (problem,) = refused(path)
    assert "larger than" in problem.message


def test_a_nul_byte_in_the_file_is_refused_at_its_line(tmp_path):
    (problem,) = refused(write(tmp_path, "nul.yaml", "version: 1\nname: a\x00b\n"))
    assert "NUL" in problem.message and problem.line == 2


@pytest.mark.parametrize("bad", ["a\x00b.onnx", "a" * 5000 + ".onnx", "x/" * 3000 + "m.onnx"])
def test_impossible_input_paths_are_refused_where_they_stand(tmp_path, tiny_onnx, bad):
    workflow = tiny_workflow(tiny_onnx)
    workflow["input"]["path"] = bad
    problems = refused(write_workflow(tmp_path, workflow))
    assert [p.where for p in problems] == ["input.path"]
    assert "NUL" in problems[0].message or "path this long" in problems[0].message
    assert problems[0].line is not None and len(problems[0].render()) < 2000


@pytest.mark.parametrize("bad", ["a\x00b.txt", "a" * 5000 + ".txt"])
def test_impossible_data_paths_are_refused_where_they_stand(tmp_path, tiny_onnx, bad):
    workflow = tiny_workflow(tiny_onnx)
    workflow["data"]["lines"] = {"source": "text_lines", "path": bad}
    problems = refused(write_workflow(tmp_path, workflow))
    assert [p.where for p in problems] == ["data.lines.path"]


@pytest.mark.parametrize("bad", ["a\x00b", "a" * 5000])
def test_impossible_output_and_cache_dirs_are_refused(tmp_path, tiny_onnx, bad):
    workflow = tiny_workflow(tiny_onnx, output={"dir": bad}, cache={"dir": bad})
    problems = refused(write_workflow(tmp_path, workflow))
    assert sorted(p.where for p in problems) == ["cache.dir", "output.dir"]


def test_the_cli_refuses_odd_workflow_paths_with_exit_2(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path / ("a" * 5000 + ".yaml"), tmp_path / "missing.yaml"):
        done = subprocess.run([*engine_cmd(), "validate", str(path)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        assert len(done.stderr) < 2000


def test_json_workflows_keep_their_lines(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    path = tmp_path / "w.json"
    path.write_text(json.dumps(workflow, indent=2))
    assert read_workflow(path).line_of(("steps", 0, "pass")) is not None
