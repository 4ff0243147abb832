"""`engine run A.yaml B.yaml`: several workflows as one pool over one store; a job they share
runs once; a summary per workflow, the fleet's table, and the fleet's exit code."""

from __future__ import annotations

import json
from pathlib import Path

from engine_helpers import tiny_workflow, write_workflow

from engine.cli.main import main


def _workflow(tiny_onnx: Path, name: str, bar: float = 0.9) -> dict:
    workflow = tiny_workflow(tiny_onnx, name=name, search={"baselines": False})
    workflow["evaluate"] = [{"id": "size", "evaluator": "size"}, {"id": "fidelity", "evaluator": "fidelity", "config": {"data": "rows"}}]
    workflow["select"] = {
        "objective": {"metric": "size.file_bytes", "goal": "min"},
        "constraints": [{"metric": "fidelity.cosine_mean", "min": bar}],
    }
    return workflow


def _placed(events: Path, kind: str) -> list[dict]:
    return [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == kind]


def test_a_fleet_runs_a_shared_job_once_and_exits_0_when_every_workflow_chose(tmp_path, tiny_onnx, capsys):
    a = write_workflow(tmp_path / "wf", _workflow(tiny_onnx, "alpha"), "a.yaml")
    write_workflow(tmp_path / "wf", _workflow(tiny_onnx, "beta"), "b.yaml")
    out = tmp_path / "out"
    code = main(["run", str(a.parent), "--store", str(tmp_path / "store"), "--output", str(out), "--workers", "2", "-q"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "fleet: 2 of 2 workflows" in printed and "alpha" in printed and "beta" in printed
    for name in ("alpha", "beta"):
        records = json.loads((out / name / "candidates.json").read_text())
        assert any(c["chosen"] for c in records["candidates"])
    # the two workflows plan the same two quantization jobs: each ran once, in one of them
    ran = _placed(out / "alpha" / "events.jsonl", "job_node") + _placed(out / "beta" / "events.jsonl", "job_node")
    assert len(ran) == 2


def test_a_fleet_exits_1_when_one_workflow_chose_nothing(tmp_path, tiny_onnx, capsys):
    good = write_workflow(tmp_path / "wf", _workflow(tiny_onnx, "good"), "good.yaml")
    bad = write_workflow(tmp_path / "wf", _workflow(tiny_onnx, "strict", bar=1.5), "strict.yaml")
    code = main(["run", str(good), str(bad), "--store", str(tmp_path / "store"), "--output", str(tmp_path / "out"), "-q"])
    assert code == 1
    assert "fleet: 1 of 2 workflows" in capsys.readouterr().out


def test_a_bad_workflow_stops_the_fleet_before_anything_runs(tmp_path, tiny_onnx, capsys):
    good = write_workflow(tmp_path / "wf", _workflow(tiny_onnx, "good"), "good.yaml")
    broken = _workflow(tiny_onnx, "broken")
    broken["targets"][0]["placement"] = {"resources": {"gpu_h100": -1}}
    bad = write_workflow(tmp_path / "wf", broken, "broken.yaml")
    code = main(["run", str(good), str(bad), "--store", str(tmp_path / "store"), "--output", str(tmp_path / "out")])
    assert code == 2
    assert "broken.yaml" in capsys.readouterr().err and not (tmp_path / "out" / "good").exists()
