"""The files of an output folder: every one with the mode any new file gets here, and an
events.jsonl that holds the events of the run that wrote the folder, not of every run before."""

from __future__ import annotations

import json
import os
import stat

from engine.cli.main import main
from engine.store.store import file_mode, write_json_atomic
from tests.engine.engine_helpers import tiny_workflow, write_workflow


def _run(tmp_path, workflow) -> int:
    return main(["run", str(workflow), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out"), "-q", "-j", "1"])


def test_outputs_share_one_mode_and_each_run_logs_only_its_events(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx, select={"objective": {"metric": "size.file_bytes", "goal": "min"}})
    workflow["evaluate"] = [{"id": "size", "evaluator": "size"}]
    path = write_workflow(tmp_path, workflow)
    assert _run(tmp_path, path) == 0
    events = tmp_path / "out" / "events.jsonl"
    first = [json.loads(line)["event"] for line in events.read_text().splitlines()]
    assert _run(tmp_path, path) == 0
    second = [json.loads(line)["event"] for line in events.read_text().splitlines()]
    assert first.count("candidate_end") == second.count("candidate_end") == 3  # the reference and two variants
    assert second.count("run_start") <= 1 and len(second) <= len(first)
    modes = {
        f.relative_to(tmp_path / "out").as_posix(): stat.S_IMODE(f.stat().st_mode) for f in (tmp_path / "out").rglob("*") if f.is_file()
    }
    assert any(name.endswith("inference_settings.json") for name in modes)
    assert not [name for name in modes if name.startswith(".")]  # no log left half-written
    assert {name: mode for name, mode in modes.items() if mode & 0o777 != file_mode()} == {}


def test_write_json_atomic_respects_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        import engine.store.store

        engine.store.store._umask = None
        write_json_atomic(tmp_path / "a.json", {"a": 1})
        assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o640
    finally:
        os.umask(old)
        engine.store.store._umask = None
