"""bench/_records.py: jobs per node and a step's runs counted from events.jsonl lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from _records import jobs_per_node, read_events, spread, step_runs  # noqa: E402


def _node(label: str) -> dict[str, object]:
    return {"id": label * 2, "label": label, "host": "h", "began": 1.0, "ended": 2.0}


EVENTS = [
    {"event": "job_start", "job": "export"},
    {"event": "job_node", "job": "export", "node": _node("node_1")},
    {"event": "job_end", "job": "export", "status": "ran", "seconds": 3.0},
    {"event": "job_node", "job": "int8(per_channel=true)", "node": _node("node_2")},
    {"event": "job_end", "job": "int8(per_channel=true)", "status": "ran", "seconds": 1.0},
    {"event": "eval_node", "candidate": "c1", "evaluation": "size", "node": _node("node_2")},
    {"event": "job_end", "job": "exported", "status": "ran", "seconds": 1.0},
    {"event": "job_end", "job": "export(opset=18)", "status": "hit"},
    {"event": "job_end", "job": "export(opset=17)", "status": "shared"},
    {"event": "job_end", "job": "export(opset=19)", "status": "ran"},
]


def test_jobs_per_node_counts_passes_and_evaluations_by_label(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in EVENTS) + "\n")
    counts = jobs_per_node(read_events(path))
    assert counts == {"node_1": 1, "node_2": 2}
    assert spread(counts) == "node_1 1 · node_2 2"
    assert spread({}) == "no node recorded"


def test_step_runs_counts_only_the_steps_own_jobs_that_ran():
    assert step_runs(EVENTS, "export") == 2  # export and export(opset=19); not exported, a hit or a shared one
    assert step_runs(EVENTS, "int8") == 1
    assert step_runs(EVENTS, "fuse") == 0
