"""Names a person chooses also name files and folders: they cannot lead a write outside the
output folder, the store or a path the user gave as such."""

from __future__ import annotations

import os
import subprocess

import pytest
from engine_helpers import engine_cmd, tiny_workflow, write_workflow

from engine.core.errors import InputError
from engine.workflow import load_workflow


@pytest.mark.parametrize("bad", ["../../x", "/tmp/kiln-escape", "a/b", "..", ".hidden", "cpu\x00", ""])
def test_a_target_id_that_is_not_a_plain_name_is_refused(tmp_path, tiny_onnx, bad):
    workflow = tiny_workflow(tiny_onnx)
    workflow["targets"][0]["id"] = bad
    workflow["steps"][0]["targets"] = [bad]
    with pytest.raises(InputError) as caught:
        load_workflow(write_workflow(tmp_path, workflow))
    where = [p.where for p in caught.value.problems]
    assert "targets[0].id" in where
    problem = caught.value.problems[where.index("targets[0].id")]
    assert problem.line is not None and "pattern" in problem.message


def test_a_target_id_that_escapes_is_refused_before_anything_is_written(tmp_path, tiny_onnx):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    workflow = tiny_workflow(tiny_onnx)
    workflow["targets"][0]["id"] = str(outside)
    workflow["steps"][0].pop("search")
    path = write_workflow(tmp_path, workflow)
    out, store = tmp_path / "out", tmp_path / "store"
    done = subprocess.run(
        [*engine_cmd(), "run", str(path), "-o", str(out), "--store", str(store)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert "targets[0].id" in done.stderr and "Traceback" not in done.stderr
    assert (outside / "keep.txt").read_text() == "mine" and sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert not out.exists() and not store.exists()


def test_a_plain_target_id_names_its_output_folder(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["targets"][0]["id"] = "cpu-int8_1"
    workflow["steps"][0]["targets"] = ["cpu-int8_1"]
    assert list(load_workflow(write_workflow(tmp_path, workflow)).targets) == ["cpu-int8_1"]


def test_a_run_writes_only_into_its_output_folder_and_store(tmp_path, tiny_onnx):
    """Everything a run writes lands in the output folder or the store: nothing in the working
    directory or beside the workflow and its model. HOME and TMPDIR are left to libraries: ONNX
    Runtime writes its telemetry ids there (~/.cache/Microsoft/DeveloperTools, $TMPDIR/.ses)."""
    workflow = tiny_workflow(tiny_onnx)
    workflow["evaluate"][1]["config"]["runs"] = 3
    path = write_workflow(tmp_path / "project", workflow)
    for folder in ("cwd", "home", "tmp"):
        (tmp_path / folder).mkdir()
    before = {p for p in tmp_path.rglob("*")}
    env = {
        **os.environ,
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path / "tmp"),
        "XDG_CACHE_HOME": str(tmp_path / "home" / ".cache"),
    }
    env.pop("KILN_STORE", None)
    out, store = tmp_path / "out", tmp_path / "store"
    done = subprocess.run(
        [*engine_cmd(), "run", str(path), "-o", str(out), "--store", str(store), "-q"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path / "cwd",
        env=env,
    )
    assert done.returncode == 0, done.stderr
    kept = (out, store, tmp_path / "home", tmp_path / "tmp")
    stray = [p for p in tmp_path.rglob("*") if p not in before and not any(p.is_relative_to(k) for k in kept)]
    assert stray == []
    assert (out / "cpu" / "model").is_dir()
