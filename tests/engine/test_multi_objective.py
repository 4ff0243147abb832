"""Several objectives (issue 17, item 6): the Pareto front of the feasible candidates is the
result, ``select.choose`` picks one model from it, the samplers optimize all objectives, and a
study is named by what the search explores, not by its budget (item 2)."""

from __future__ import annotations

import json
import subprocess

import optuna
import pytest
from engine_helpers import engine_cmd, tiny_workflow, write_workflow

from engine.core.errors import InputError
from engine.execute.hooks import Hooks
from engine.run import run_workflow
from engine.store.store import Store
from engine.workflow import load_workflow

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")

ERROR, SIZE = "fidelity.max_abs_error", "size.file_bytes"


def _workflow(tiny_onnx, **select):
    workflow = tiny_workflow(tiny_onnx, search={"sampler": "tpe", "seed": 0})
    workflow["steps"][0]["search"] = {"per_channel": [False, True], "reduce_range": [False, True]}
    workflow["evaluate"] = [workflow["evaluate"][0], {"id": "size", "evaluator": "size"}]
    workflow["select"] = {"objective": [{"metric": ERROR, "goal": "min"}, {"metric": SIZE, "goal": "min"}], "constraints": [], **select}
    return workflow


def _dominated(a, b):
    """b dominates a (both minimized)."""
    return all(b[m] <= a[m] for m in (ERROR, SIZE)) and any(b[m] < a[m] for m in (ERROR, SIZE))


@pytest.mark.parametrize(("choose", "best_on"), [("first", ERROR), ({"weights": [1.0, 0.0]}, ERROR), ({"weights": [0.0, 1.0]}, SIZE)])
def test_the_front_is_the_result_and_choose_picks_from_it(tmp_path, tiny_onnx, choose, best_on):
    report = run_workflow(load_workflow(write_workflow(tmp_path, _workflow(tiny_onnx, choose=choose))), Store(tmp_path / "store"))
    done = [r for r in report.results if r.state == "complete"]
    assert len(done) == 5  # the reference and four INT8 points, none twice
    assert len({json.dumps(r.candidate.params, sort_keys=True) for r in done}) == 5
    front = [r for r in done if r.pareto]
    for r in done:
        assert r.pareto == (not any(_dominated(r.metrics, o.metrics) for o in done if o is not r))
        if not r.pareto:
            assert r.verdict.startswith("dominated by #")
    assert any(r.candidate.reference for r in front) and len(front) >= 2  # FP32: least error; INT8: smaller
    (chosen,) = [r for r in done if r.chosen]
    assert chosen.pareto
    assert chosen.metrics[best_on] == min(r.metrics[best_on] for r in front)
    if choose != "first":
        assert all("weighted score" in r.verdict for r in front)


def test_the_sampler_is_told_every_objective(tmp_path, tiny_onnx):
    store = tmp_path / "store"
    run_workflow(load_workflow(write_workflow(tmp_path, _workflow(tiny_onnx))), Store(store))
    (summary,) = optuna.get_all_study_summaries(f"sqlite:///{store / 'search.db'}")
    assert [d.name for d in summary.directions] == ["MINIMIZE", "MINIMIZE"]
    study = optuna.load_study(study_name=summary.study_name, storage=f"sqlite:///{store / 'search.db'}")
    told = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert told and all(len(t.values) == 2 for t in told)


def _problems(tmp_path, workflow):
    with pytest.raises(InputError) as caught:
        load_workflow(write_workflow(tmp_path, workflow))
    return caught.value.problems


def test_an_unknown_metric_in_the_list_and_a_single_objective_sampler_are_refused(tmp_path, tiny_onnx):
    workflow = _workflow(tiny_onnx)
    workflow["select"]["objective"][1]["metric"] = "size.file_byte"
    (problem,) = _problems(tmp_path / "a", workflow)
    assert problem.where == "select.objective[1].metric" and problem.hint == "did you mean 'size.file_bytes'?"
    workflow = _workflow(tiny_onnx)
    workflow["search"]["sampler"] = "cmaes"
    path = write_workflow(tmp_path / "b", workflow)
    done = subprocess.run([*engine_cmd(), "validate", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout
    assert "search.sampler" in done.stdout + done.stderr and "optimizes one objective" in done.stdout + done.stderr
    workflow = _workflow(tiny_onnx, choose={"weights": [1.0, 1.0, 1.0]})
    (problem,) = _problems(tmp_path / "c", workflow)
    assert "3 weights for 2 objectives" in problem.message


class Studies(Hooks):
    def __init__(self):
        self.opened = []

    def study_opened(self, target, study, note):
        self.opened.append({"target": target, "study": study, "note": note})


def test_a_larger_budget_continues_the_study_and_a_changed_space_starts_one(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx, search={"sampler": "random", "seed": 0, "max_candidates": 3})
    workflow["steps"][0]["search"] = {"per_channel": [False, True], "reduce_range": [False, True]}
    workflow["evaluate"] = [workflow["evaluate"][0]]
    workflow["select"] = {"objective": {"metric": ERROR, "goal": "min"}, "constraints": []}
    store, notes = tmp_path / "store", []
    for budget, space in ((3, [False, True]), (5, [False, True]), (5, [False])):
        workflow["search"]["max_candidates"] = budget
        workflow["steps"][0]["search"]["reduce_range"] = space
        hooks = Studies()
        run_workflow(load_workflow(write_workflow(tmp_path, workflow)), Store(store), hooks=hooks)
        (event,) = hooks.opened
        notes.append(event)
    assert notes[0]["note"] == "a new study" and notes[1]["study"] == notes[0]["study"]
    assert notes[1]["note"].startswith("continues its study (")
    assert notes[2]["study"] != notes[0]["study"]
    assert "a new study, since the search changed: steps.int8.search.reduce_range" in notes[2]["note"]
