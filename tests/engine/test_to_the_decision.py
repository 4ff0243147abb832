"""The objective's timing measured to its decision (engine.execute.evaluation.to_the_decision):
where a runoff ranks the faster candidates, a candidate's timing against its reference ends once
it is faster beyond the practical margin; elsewhere the workflow's options stand as written."""

from __future__ import annotations

from typing import Any

from engine_helpers import tiny_workflow, write_workflow

from engine.execute.evaluation import FASTER_OPTION, WITHIN_OPTION, candidate_evaluations
from engine.report.plan_status import explain_plan
from engine.run import run_workflow
from engine.store.store import Store
from engine.workflow import load_workflow


def _latency_config(tmp_path, tiny_onnx, **select: Any) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    workflow = tiny_workflow(tiny_onnx)
    workflow["select"] = {**workflow["select"], **select}
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    return next(spec.config for spec in candidate_evaluations(resolved) if spec.id == "latency")


def test_with_the_runoff_the_timing_stops_once_faster_than_the_tie_margin(tmp_path, tiny_onnx) -> None:
    assert _latency_config(tmp_path / "a", tiny_onnx, runoff=True)[FASTER_OPTION] == 1.0  # no margin: faster at all
    assert _latency_config(tmp_path / "b", tiny_onnx, runoff=True, tie_within=0.1)[FASTER_OPTION] == 1.1


def test_with_a_tie_margin_the_timing_stops_once_equivalent_within_it(tmp_path, tiny_onnx) -> None:
    assert _latency_config(tmp_path / "a", tiny_onnx, runoff=True, tie_within=0.1)[WITHIN_OPTION] == 0.1
    assert _latency_config(tmp_path / "b", tiny_onnx, runoff=True)[WITHIN_OPTION] is None  # no margin: nothing is equivalent
    assert _latency_config(tmp_path / "c", tiny_onnx, runoff=False, tie_within=0.1)[WITHIN_OPTION] is None


def test_the_workflow_is_left_as_written_where_the_first_timing_must_decide(tmp_path, tiny_onnx) -> None:
    assert _latency_config(tmp_path / "a", tiny_onnx, runoff=False)[FASTER_OPTION] is None  # nothing ranks them after
    bars = [{"metric": "latency.speedup", "min": 1.5}, {"metric": "fidelity.cosine_mean", "min": 0.9}]
    assert _latency_config(tmp_path / "b", tiny_onnx, runoff=True, constraints=bars)[FASTER_OPTION] is None  # its bar is the decision
    workflow = tiny_workflow(tiny_onnx)
    workflow["select"]["runoff"] = True
    next(e for e in workflow["evaluate"] if e["id"] == "latency")["config"][FASTER_OPTION] = 3.0
    resolved = load_workflow(write_workflow(tmp_path / "c", workflow))
    assert next(s.config for s in candidate_evaluations(resolved) if s.id == "latency")[FASTER_OPTION] == 3.0


def test_a_run_stops_its_timings_as_decided_and_the_plan_finds_them_in_the_store(tmp_path, tiny_onnx) -> None:
    workflow = tiny_workflow(tiny_onnx)
    workflow["select"]["runoff"] = True
    path = write_workflow(tmp_path, workflow)
    store = Store(tmp_path / "store")
    report = run_workflow(load_workflow(path), store)
    timed = [r for r in report.results if r.state == "complete" and not r.candidate.reference and "latency" in r.details]
    assert timed
    for result in timed:
        reason = result.details["latency"]["stopped_because"]
        # a timing that ended as decided faster has its whole interval above 1
        assert not reason.startswith("faster than") or result.metrics["latency.speedup_low"] > 1.0, reason
    # `engine plan` keys the evaluations as the run did: every one is found
    status = explain_plan(load_workflow(path), store)
    marks = [mark for statuses in status.candidates.values() for c in statuses for mark in c.evaluations.values()]
    assert marks and set(marks) == {"hit"}
