"""The targets are searched at once: one target's passes run while another target's search is
still going, and each target's candidates, ids and choice are what a search of that target alone
gives."""

from __future__ import annotations

import json

from engine_helpers import two_targets, write_workflow

from engine.run import run_workflow
from engine.store.store import Store
from engine.workflow import load_workflow


def test_one_targets_pass_runs_while_another_target_is_searched(tmp_path, tiny_onnx, test_plugins):
    path = write_workflow(tmp_path, two_targets(tiny_onnx, 4.0))
    report = run_workflow(load_workflow(path), Store(tmp_path / "store"), workers=2)
    slept = {
        report.plan.jobs[job_id].step_id: job.record["details"]["slept"]
        for job_id, job in report.jobs.items()
        if job.record and "slept" in (job.record.get("details") or {})
    }
    assert sorted(slept) == ["slow_a", "slow_b"], slept
    (a_start, a_end), (b_start, b_end) = slept["slow_a"], slept["slow_b"]
    assert a_start < b_end and b_start < a_end, f"the two targets' passes did not overlap: {slept}"
    # ids and order per target as a sequential search gives them: reference first, then its one path
    assert [(r.candidate.id, r.candidate.reference) for r in report.results] == [
        ("a/0", True),
        ("a/1", False),
        ("b/0", True),
        ("b/1", False),
    ]
    assert all(r.state == "complete" for r in report.results)


def test_a_re_run_of_targets_searched_at_once_is_served_from_the_store(tmp_path, tiny_onnx, test_plugins):
    path = write_workflow(tmp_path, two_targets(tiny_onnx, 0.5))
    store = Store(tmp_path / "store")
    first = run_workflow(load_workflow(path), store, workers=2)
    again = run_workflow(load_workflow(path), store, workers=2)
    assert again.stats.passes_run == 0 and again.stats.evals_run == 0
    assert [json.dumps(r.metrics, sort_keys=True) for r in again.results] == [json.dumps(r.metrics, sort_keys=True) for r in first.results]
