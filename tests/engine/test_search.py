"""The search: samplers, ranges, conditional options, budgets, resume, parallel workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from engine_helpers import engine_cmd, tiny_workflow, write_workflow

from engine.core.errors import InputError
from engine.plan.planner import build_plan
from engine.run import run_workflow
from engine.store.store import Store
from engine.workflow import load_workflow


def quantize_space(**search):
    """A 12-point space over the tiny encoder: 2 x 2 x 3 (the third a conditional range)."""
    return {
        "per_channel": [False, True],
        "reduce_range": [False, True],
        **search,
    }


def test_ranges_and_conditions_shape_the_grid(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [
        {"id": "a", "pass": "sleep", "config": {"seconds": 0}, "search": {"seconds": {"low": 0, "high": 2}}},
        {"id": "b", "pass": "copy", "after": "a", "search": {"tag": {"values": ["x", "y"], "when": {"tag": "never"}}}},
    ]
    plan = build_plan(load_workflow(write_workflow(tmp_path, workflow)))
    space = plan.spaces["cpu"]
    assert space.size() == 3  # seconds 0, 1, 2; b.tag is inactive (its condition never holds)
    assert [c.params for c in plan.candidates_of("cpu")][1:] == [{"a.seconds": 0}, {"a.seconds": 1}, {"a.seconds": 2}]


def test_a_conditional_option_appears_only_when_its_condition_holds(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [
        {"id": "a", "pass": "copy", "search": {"tag": ["plain", "fancy"]}},
        {
            "id": "b",
            "pass": "sleep",
            "after": "a",
            "config": {"seconds": 0},
            "search": {"seconds": {"values": [0, 1], "when": {"seconds": 0}}},
        },
    ]
    plan = build_plan(load_workflow(write_workflow(tmp_path, workflow)))
    assert plan.spaces["cpu"].size() == 4


def test_a_searched_point_that_is_not_a_valid_config_is_reported(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"][0]["search"] = {"weight_type": ["qint8", "qint4"]}
    with pytest.raises(InputError) as caught:
        load_workflow(write_workflow(tmp_path, workflow))
    (problem,) = caught.value.problems
    assert problem.where == "steps[0].search.weight_type" and "qint4" in problem.message


def test_random_and_tpe_respect_the_budget_and_are_reproducible(tmp_path, tiny_onnx):
    chosen = {}
    for sampler in ("random", "tpe"):
        picks = []
        for attempt in range(2):
            workflow = tiny_workflow(tiny_onnx, search={"sampler": sampler, "max_candidates": 5, "seed": 3})
            workflow["steps"][0]["search"] = quantize_space()
            folder = tmp_path / f"{sampler}{attempt}"
            report = run_workflow(load_workflow(write_workflow(folder, workflow)), Store(folder / "store"))
            assert len(report.results) == 5  # reference, baseline, and 3 sampled
            picks.append([r.candidate.params for r in report.results])
        assert picks[0] == picks[1]
        chosen[sampler] = picks[0]
    assert chosen["random"][0] == {} and chosen["random"][1] == {"int8.per_channel": False, "int8.reduce_range": False}


def test_stop_when_ends_the_search_once_a_goal_is_met(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx, search={"sampler": "grid", "stop_when": [{"metric": "fidelity.cosine_mean", "min": 0.5}]})
    workflow["steps"][0]["search"] = quantize_space()
    report = run_workflow(load_workflow(write_workflow(tmp_path, workflow)), Store(tmp_path / "store"))
    assert len(report.results) == 2  # the reference met the goal: nothing more was asked


def test_untimed_when_a_cheap_metric_already_breaks_a_constraint(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["select"]["constraints"] = [{"metric": "fidelity.cosine_mean", "min": 0.99999999}]
    report = run_workflow(load_workflow(write_workflow(tmp_path, workflow)), Store(tmp_path / "store"))
    quantized = [r for r in report.results if not r.candidate.reference]
    assert quantized and all(r.untimed and r.feasible is False for r in quantized)
    assert all("latency.p50_ms" not in r.metrics for r in quantized)
    assert "latency.p50_ms" in report.results[0].metrics


def test_a_candidate_that_breaks_a_constraint_is_not_measured_further_unless_asked(tmp_path, tiny_onnx):
    """A second fidelity dataset after the one that broke the bar is skipped (it cannot make the
    candidate choosable); with ``time_infeasible: true`` every evaluation runs."""
    for time_infeasible in (False, True):
        workflow = tiny_workflow(tiny_onnx, search={"time_infeasible": time_infeasible})
        workflow["data"]["again"] = {**workflow["data"]["rows"], "seed": 1}
        workflow["evaluate"].insert(1, {"id": "again", "evaluator": "fidelity", "config": {"data": "again"}})
        workflow["select"]["constraints"] = [
            {"metric": "fidelity.cosine_mean", "min": 0.99999999},
            {"metric": "again.cosine_mean", "min": 0.5},
        ]
        folder = tmp_path / str(time_infeasible)
        report = run_workflow(load_workflow(write_workflow(folder, workflow)), Store(folder / "store"))
        quantized = [r for r in report.results if not r.candidate.reference]
        assert quantized and all(r.feasible is False for r in quantized)
        assert all("fidelity.cosine_mean" in r.metrics for r in quantized)
        measured_again = ["again.cosine_mean" in r.metrics for r in quantized]
        assert measured_again == [time_infeasible] * len(quantized)
        assert all(("latency.p50_ms" in r.metrics) is time_infeasible for r in quantized)
        assert all(any("fidelity.cosine_mean" in v for v in r.violations) for r in quantized)
        assert "again.cosine_mean" in report.results[0].metrics  # the reference is measured by every evaluation


def test_a_failed_job_prunes_the_candidates_that_share_it(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [
        {"id": "bad", "pass": "boom"},
        {"id": "after", "pass": "copy", "after": "bad", "search": {"tag": ["x", "y"]}},
    ]
    report = run_workflow(load_workflow(write_workflow(tmp_path, workflow)), Store(tmp_path / "store"))
    states = [(r.state, r.reason) for r in report.results if not r.candidate.reference]
    assert states[0][0] == "failed" and "the library refused" in states[0][1]
    assert [s for s, _ in states[1:]] == ["pruned", "pruned"]
    assert all("shares step bad" in why and "cpu/1" in why for _, why in states[1:])


def test_pareto_front_is_marked_and_kept(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx, output={"keep": "pareto", "dir": str(tmp_path / "out")})
    path = write_workflow(tmp_path, workflow)
    done = subprocess.run(
        [*engine_cmd(), "run", str(path), "--store", str(tmp_path / "store")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    records = json.loads((tmp_path / "out" / "candidates.json").read_text())["candidates"]
    front = [r for r in records if r["pareto"]]
    assert front and all(r["state"] == "complete" for r in front)
    kept = sorted(p.name for p in (tmp_path / "out" / "cpu" / "candidates").iterdir())
    assert kept == sorted(r["id"].split("/")[-1] for r in front)


def test_two_workers_choose_what_one_worker_chooses(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"][0]["search"] = quantize_space()
    workflow["select"] = {"objective": {"metric": "fidelity.max_abs_error", "goal": "min"}, "constraints": []}
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    one = run_workflow(resolved, Store(tmp_path / "one"), workers=1)
    two = run_workflow(resolved, Store(tmp_path / "two"), workers=2)
    assert [r.candidate.params for r in one.results] == [r.candidate.params for r in two.results]
    assert [r.chosen for r in one.results] == [r.chosen for r in two.results]
    assert two.stats.passes_run == one.stats.passes_run == 4


def test_a_killed_tpe_search_resumes_and_chooses_as_an_uninterrupted_one(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx, search={"sampler": "tpe", "max_candidates": 7, "seed": 1})
    workflow["steps"] = [{"id": "slow", "pass": "sleep", "config": {"seconds": 0.0}, "search": {"seconds": {"low": 0.0, "high": 0.2}}}]
    # a deterministic objective, so the two runs see the same history
    workflow["select"] = {"objective": {"metric": "fidelity.cosine_mean", "goal": "max"}, "constraints": []}
    workflow["evaluate"] = [workflow["evaluate"][0]]
    path = write_workflow(tmp_path / "killed", workflow)
    store = tmp_path / "killed" / "store"
    process = subprocess.Popen(
        [*engine_cmd(), "run", str(path), "--store", str(store), "-o", str(tmp_path / "killed" / "out")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and len(list((store / "keys").glob("*.json")) if (store / "keys").is_dir() else []) < 6:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    resumed = run_workflow(load_workflow(path), Store(store))
    uninterrupted = run_workflow(load_workflow(write_workflow(tmp_path / "whole", workflow)), Store(tmp_path / "whole" / "store"))
    assert len(resumed.results) == len(uninterrupted.results) == 7
    assert sorted(json.dumps(r.candidate.params, sort_keys=True) for r in resumed.results) == sorted(
        json.dumps(r.candidate.params, sort_keys=True) for r in uninterrupted.results
    )
    assert [r.label for r in resumed.results if r.chosen] == [r.label for r in uninterrupted.results if r.chosen]


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_concurrent_runs_on_one_store_finish_with_one_choice_and_share_jobs(tmp_path, tiny_onnx, sampler):
    workflow = tiny_workflow(tiny_onnx, search={"sampler": sampler, "seed": 0})
    path = write_workflow(tmp_path, workflow)
    runs = [
        subprocess.Popen(
            [*engine_cmd(), "run", str(path), "--store", str(tmp_path / "store"), "-o", str(tmp_path / f"out{i}")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    choices = set()
    for i in range(3):
        records = json.loads((tmp_path / f"out{i}" / "candidates.json").read_text())["candidates"]
        (chosen,) = [r for r in records if r["chosen"]]
        choices.add((chosen["path"], json.dumps(chosen["metrics"], sort_keys=True)))
    assert len(choices) == 1  # the same candidate, with the same figures: every job was built once
    ran = sum(int(out.split("passes: ")[1].split(" run")[0]) for out, _ in outputs)
    assert ran == 2  # the two INT8 models, built by whichever run got there first


def test_an_unmeasured_reference_is_made_for_the_comparisons_but_is_no_candidate(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx, search={"sampler": "grid", "reference": False, "max_candidates": 2})
    workflow["steps"] = [
        {"id": "copy", "pass": "copy"},  # the reference is the copy: made, shared by both candidates, never timed alone
        {"id": "int8", "pass": "ort_quantize", "after": "copy", "config": {"mode": "dynamic"}, "search": {"per_channel": [False, True]}},
    ]
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    plan = build_plan(resolved)
    assert [c.reference for c in plan.candidates_of("cpu")] == [True, False, False]  # max_candidates counts the measured two
    report = run_workflow(resolved, Store(tmp_path / "store"))
    assert [r.candidate.params for r in report.results] == [{"int8.per_channel": False}, {"int8.per_channel": True}]
    assert all(r.state == "complete" and not r.candidate.reference for r in report.results)
    # latency's paired timing and the fidelity ran against the reference's model all the same
    assert all(r.metrics["latency.speedup"] > 0 and "fidelity.cosine_mean" in r.metrics for r in report.results)
    assert report.stats.passes_run == 3 and report.chosen()["cpu"] is not None


def test_a_drop_constraint_needs_the_reference_measured(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx, search={"reference": False, "stop_when": [{"metric": "latency.p50_ms", "max_drop_ratio": 0.1}]})
    workflow["select"]["constraints"] = [{"metric": "fidelity.cosine_mean", "min": 0.9, "max_drop": 0.01}]
    with pytest.raises(InputError) as caught:
        load_workflow(write_workflow(tmp_path, workflow))
    wheres = [problem.where for problem in caught.value.problems]
    assert wheres == ["select.constraints[0].max_drop", "search.stop_when[0].max_drop_ratio"]
    assert all("search.reference" in p.message and p.hint for p in caught.value.problems)
    workflow["search"].pop("reference")
    load_workflow(write_workflow(tmp_path, workflow))  # measured (the default): valid


def test_a_grid_keeps_every_worker_busy_while_one_candidate_is_slow(tmp_path, tiny_onnx, test_plugins):
    """The grid's next point is asked for as soon as a worker is free: the three quick candidates
    are done while the slow one still runs (in waves of two, two of them waited for it)."""
    workflow = tiny_workflow(tiny_onnx, output={"dir": str(tmp_path / "out")})
    workflow["steps"] = [{"id": "nap", "pass": "sleep", "search": {"seconds": [6.0, 0.1, 0.2, 0.3]}}]
    workflow["search"] = {"sampler": "grid", "baselines": False}  # the grid's points only, in order
    workflow["evaluate"] = workflow["evaluate"][:1]
    workflow["select"] = {"objective": {"metric": "fidelity.max_abs_error", "goal": "min"}, "constraints": []}
    path = write_workflow(tmp_path, workflow)
    done = subprocess.run(
        [*engine_cmd(), "run", str(path), "--store", str(tmp_path / "store"), "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    records = json.loads((tmp_path / "out" / "candidates.json").read_text())["candidates"]
    slept = {r["steps"][0]["config"]["seconds"]: r["steps"][0]["details"]["slept"] for r in records if r["steps"]}
    assert sorted(slept) == [0.1, 0.2, 0.3, 6.0]
    slow_ended = slept.pop(6.0)[1]
    assert all(end < slow_ended for _, end in slept.values()), slept
