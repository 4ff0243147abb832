"""explain_plan: what `engine plan` shows, as data (per job hit/miss/blocked with its key and what
changed, per candidate per evaluation hit/miss), computed without running anything."""

from __future__ import annotations

from engine_helpers import tiny_workflow, write_workflow

from engine.report.plan_status import BLOCKED, HIT, MISS, explain_plan
from engine.run import run_workflow
from engine.store.store import Store
from engine.workflow import load_workflow


def _workflow(tiny_onnx, tag: str = "a") -> dict:
    workflow = tiny_workflow(tiny_onnx, search={"baselines": False})
    workflow["steps"] = [
        {"id": "first", "pass": "copy", "config": {"tag": tag}},
        {"id": "second", "pass": "copy", "after": "first", "config": {"tag": "b"}},
    ]
    workflow["evaluate"] = [{"id": "fidelity", "evaluator": "fidelity", "config": {"data": "rows"}}]
    workflow["select"] = {"objective": {"metric": "fidelity.cosine_mean", "goal": "max"}}
    return workflow


def test_explain_plan_reports_misses_blocked_jobs_then_hits_and_what_changed(tmp_path, tiny_onnx, test_plugins):
    path = write_workflow(tmp_path, _workflow(tiny_onnx))
    store = Store(tmp_path / "store")

    before = explain_plan(load_workflow(path), store)
    assert [(j.label, j.depth, j.state) for j in before.jobs] == [("first", 0, MISS), ("second", 1, BLOCKED)]
    assert before.jobs[0].key is not None and before.jobs[0].changed is None  # never run before
    assert before.jobs[1].key is None
    assert before.job_count == 2 and before.evaluations == 1
    candidates = before.candidates["cpu"]
    assert [(c.label, c.reference) for c in candidates] == [("input model", True), ("first → second", False)]
    assert all(c.evaluations == {"fidelity": MISS} for c in candidates)

    report = run_workflow(load_workflow(path), store)
    after = explain_plan(load_workflow(path), store)
    assert [j.state for j in after.jobs] == [HIT, HIT]
    assert [j.key for j in after.jobs] == [report.jobs[j.job_id].key for j in after.jobs]  # the keys the run used
    assert all(c.evaluations == {"fidelity": HIT} for c in after.candidates["cpu"])

    write_workflow(tmp_path, _workflow(tiny_onnx, tag="c"))
    changed = explain_plan(load_workflow(path), store)
    assert [(j.state, j.changed) for j in changed.jobs] == [(MISS, ("config.tag",)), (BLOCKED, None)]
    assert [c.evaluations for c in changed.candidates["cpu"]] == [{"fidelity": HIT}, {"fidelity": MISS}]


def _staged(tmp_path, tiny_onnx, samples: int, bar: float = 0.5):
    """A dynamic INT8 model judged on fidelity (the evaluator staged by its max_samples) over ``samples`` rows."""
    from evaluators.fidelity import Fidelity

    assert Fidelity.stage_option == "max_samples"
    workflow = tiny_workflow(tiny_onnx, search={"baselines": False})
    workflow["data"]["rows"]["samples"] = samples
    workflow["steps"] = [{"id": "int8", "pass": "ort_quantize", "config": {"mode": "dynamic", "per_channel": True}}]
    workflow["evaluate"] = [{"id": "fidelity", "evaluator": "fidelity", "config": {"data": "rows"}}, {"id": "size", "evaluator": "size"}]
    workflow["select"] = {
        "objective": {"metric": "size.file_bytes", "goal": "min"},
        "constraints": [{"metric": "fidelity.cosine_mean", "min": bar}],
    }
    return write_workflow(tmp_path, workflow)


def test_a_dataset_no_longer_than_the_first_look_is_measured_once(tmp_path, tiny_onnx):
    from evaluators.fidelity import Fidelity

    path = _staged(tmp_path, tiny_onnx, Fidelity.stage_rows - 4, bar=0.999999)  # a bar the first look cannot settle
    store = Store(tmp_path / "store")
    report = run_workflow(load_workflow(path), store)
    quantized = next(r for r in report.results if not r.candidate.reference)
    assert quantized.details["fidelity"]["samples"] == Fidelity.stage_rows - 4
    assert "covered every row" in quantized.details["fidelity"]["stage"]
    # that one look is the candidate's record (then rejected: nothing else is measured on it)
    marks = [c.evaluations["fidelity"] for c in explain_plan(load_workflow(path), store).candidates["cpu"]]
    assert marks == [HIT, HIT] and not quantized.feasible


def test_a_staged_evaluation_settled_by_its_first_look_shows_as_a_hit(tmp_path, tiny_onnx):
    """A candidate whose bar was settled on the first rows has only that look in the store; `engine plan`
    must not promise to measure it again."""
    from evaluators.fidelity import Fidelity

    path = _staged(tmp_path, tiny_onnx, 2 * Fidelity.stage_rows)
    store = Store(tmp_path / "store")
    report = run_workflow(load_workflow(path), store)
    quantized = next(r for r in report.results if not r.candidate.reference)
    assert quantized.details["fidelity"]["samples"] == Fidelity.stage_rows  # settled on the first look alone
    after = explain_plan(load_workflow(path), store)
    assert all(c.evaluations == {"fidelity": HIT, "size": HIT} for c in after.candidates["cpu"])
