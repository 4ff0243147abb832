"""The planner: candidates are root-to-leaf paths per target; shared prefixes share jobs."""

from __future__ import annotations

from engine_helpers import tiny_workflow, write_workflow

from engine.plan.planner import build_plan
from engine.workflow import load_workflow


def plan_of(tmp_path, workflow):
    return build_plan(load_workflow(write_workflow(tmp_path, workflow)))


def test_grid_search_makes_one_candidate_per_point_plus_the_reference(tmp_path, tiny_onnx):
    plan = plan_of(tmp_path, tiny_workflow(tiny_onnx))
    assert [plan.label(c) for c in plan.candidates] == ["input model", "int8(per_channel=false)", "int8(per_channel=true)"]
    assert [c.reference for c in plan.candidates] == [True, False, False]
    assert plan.candidates[2].params == {"int8.per_channel": True}


def test_a_shared_step_is_one_job(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [
        {"id": "base", "pass": "copy"},
        {"id": "int8", "pass": "ort_quantize", "after": "base", "search": {"per_channel": [False, True], "reduce_range": [False, True]}},
    ]
    plan = plan_of(tmp_path, workflow)
    assert len(plan.candidates) == 5  # the reference (the onnx input itself) and 4 grid points
    assert sum(1 for j in plan.jobs.values() if j.step_id == "base") == 1
    assert len(plan.jobs) == 5
    base = next(j for j in plan.jobs.values() if j.step_id == "base")
    assert all(plan.jobs[c.jobs[0]] == base for c in plan.candidates if not c.reference)


def test_optional_step_adds_a_skip_candidate_and_dedupes_with_the_reference(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [
        {"id": "a", "pass": "copy"},
        {"id": "b", "pass": "copy", "after": "a", "optional": True, "config": {"tag": "b"}},
    ]
    plan = plan_of(tmp_path, workflow)
    # the reference is the input (onnx already runs); "a" alone is the b-skipped path
    assert [plan.label(c) for c in plan.candidates] == ["input model", "a → b", "a"]
    assert plan.candidates[2].params == {"b": "skip"}


def test_steps_restricted_to_a_target_run_only_on_its_paths(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx)
    workflow["targets"] = [{"id": "one", "runtime": "onnxruntime"}, {"id": "two", "runtime": "onnxruntime", "intra_op_threads": 1}]
    workflow["steps"] = [
        {"id": "shared", "pass": "copy"},
        {"id": "only_two", "pass": "copy", "after": "shared", "targets": ["two"], "config": {"tag": "z"}},
    ]
    plan = plan_of(tmp_path, workflow)
    assert [plan.label(c) for c in plan.candidates_of("one")] == ["input model", "shared"]
    assert [plan.label(c) for c in plan.candidates_of("two")] == ["input model", "shared → only_two"]
    assert sum(1 for j in plan.jobs.values() if j.step_id == "shared") == 1  # not target-dependent: runs once


def test_max_candidates_keeps_the_reference(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["search"] = {"max_candidates": 2}
    plan = plan_of(tmp_path, workflow)
    assert len(plan.candidates) == 2 and plan.candidates[0].reference
    assert any("max_candidates=2" in note for note in plan.dropped)


def test_unavailable_target_gets_no_candidates(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["targets"].append({"id": "gpu", "runtime": "onnxruntime", "device": "cuda"})
    plan = plan_of(tmp_path, workflow)
    assert "gpu" in plan.skipped_targets
    assert not plan.candidates_of("gpu")
    assert plan.candidates_of("cpu")
