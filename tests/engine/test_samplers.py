"""The sampler protocol: a sampler written outside the engine drives a search, and grid, random
and TPE answer ask/tell/resume with made-up outcomes (no engine run)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from engine_helpers import tiny_workflow, write_workflow

import engine.search.search
from engine.core import Outcome, Sampler, Trial, TrialState
from engine.plan.planner import build_plan
from engine.run import run_workflow
from engine.search.samplers import GridSampler, OptunaSampler, make_sampler
from engine.search.trials import OWNER_ATTR, owner
from engine.store.store import Store
from engine.workflow import load_workflow

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")


def _workflow(tiny_onnx: Path, **search: Any) -> dict[str, Any]:
    workflow = tiny_workflow(tiny_onnx, search=search)
    workflow["steps"][0]["search"] = {"per_channel": [False, True], "reduce_range": [False, True]}
    # a deterministic objective and no timing: fast, and the same figures every time
    workflow["select"] = {
        "objective": {"metric": "fidelity.cosine_mean", "goal": "max"},
        "constraints": [{"metric": "fidelity.cosine_mean", "min": 0.5}],
    }
    workflow["evaluate"] = [workflow["evaluate"][0]]
    return workflow


@pytest.fixture
def space(tmp_path, tiny_onnx):
    return build_plan(load_workflow(write_workflow(tmp_path, _workflow(tiny_onnx)))).spaces["cpu"]


def _optuna(tmp_path: Path, space: Any, kind: str, seed: int = 0, name: str = "s") -> OptunaSampler:
    return OptunaSampler(kind, space, f"sqlite:///{tmp_path / 'search.db'}", name, seed, "max", tmp_path / "search.lock")


class ReverseGrid:
    """A sampler as a plugin would write one: the grid backwards, remembering what it was told."""

    max_repeats: int | None = None

    def __init__(self, points: list[dict[str, Any]]) -> None:
        self.points = list(reversed(points))
        self.told: list[tuple[Trial, Outcome]] = []
        self.calls: list[str] = []

    def resume(self) -> list[Trial]:
        self.calls.append("resume")
        return []

    def ask(self) -> Trial | None:
        if not self.points:
            return None
        number = len(self.calls)
        self.calls.append("ask")
        return Trial(self.points.pop(0), number)

    def tell(self, trial: Trial, outcome: Outcome) -> None:
        self.calls.append("tell")
        self.told.append((trial, outcome))

    def close(self) -> None:
        self.calls.append("close")


def test_a_sampler_written_outside_the_engine_drives_the_search(tmp_path, tiny_onnx, monkeypatch):
    resolved = load_workflow(write_workflow(tmp_path, _workflow(tiny_onnx, sampler="tpe")))
    mine = ReverseGrid(build_plan(resolved).spaces["cpu"].grid())
    assert isinstance(mine, Sampler)
    monkeypatch.setattr(engine.search.search, "make_sampler", lambda *args, **kwargs: mine)
    report = run_workflow(resolved, Store(tmp_path / "store"), workers=1)  # one point at a time: told in the order asked
    asked = [t for t, _ in mine.told if t.number is not None]
    # the baseline first (a point it did not propose), then every point it proposed, last first
    (baseline, told) = mine.told[0]
    assert baseline.number is None and told.state is TrialState.COMPLETE
    assert [dict(t.point) for t in asked] == list(reversed(build_plan(resolved).spaces["cpu"].grid()))[: len(asked)]
    assert all(o.state is TrialState.COMPLETE and o.value is not None and set(o.slacks) == {"0:fidelity.cosine_mean"} for _, o in mine.told)
    assert all(o.slacks["0:fidelity.cosine_mean"] <= 0 for _, o in mine.told)  # cosine 0.99 clears 0.5
    assert mine.calls[:2] == ["tell", "resume"] and mine.calls[-1] == "close"  # the baseline, then resume
    assert sorted(r.candidate.params.get("int8.per_channel", False) for r in report.results if not r.candidate.reference) == [
        False,
        False,
        True,
        True,
    ]
    assert sum(r.chosen for r in report.results) == 1


def test_every_sampler_satisfies_the_protocol(tmp_path, space):
    samplers = [
        make_sampler(kind, space, f"sqlite:///{tmp_path / 'search.db'}", kind, 0, "max", tmp_path / "lock")
        for kind in ("grid", "random", "tpe")
    ]
    try:
        assert [type(s) for s in samplers] == [GridSampler, OptunaSampler, OptunaSampler]
        assert all(isinstance(s, Sampler) for s in samplers)
    finally:
        for sampler in samplers:
            sampler.close()


def test_the_grid_asks_every_point_once_in_order(space):
    grid = GridSampler(space)
    assert grid.resume() == [] and grid.max_repeats is None
    asked = []
    while (trial := grid.ask()) is not None:
        asked.append(dict(trial.point))
        grid.tell(trial, Outcome(TrialState.PRUNED))
    assert asked == space.grid() and len(asked) == 4


@pytest.mark.parametrize("kind", ["random", "tpe"])
def test_optuna_samplers_record_each_outcome_in_the_study(tmp_path, space, kind):
    sampler = _optuna(tmp_path, space, kind)
    try:
        outcomes = [
            Outcome(TrialState.COMPLETE, 0.9, {"0:fidelity.cosine_mean": -0.4}),
            Outcome(TrialState.FAILED),
            Outcome(TrialState.PRUNED),
        ]
        trials = [sampler.ask() for _ in outcomes]
        assert all(t is not None and t.point in space.grid() for t in trials)
        for trial, outcome in zip(trials, outcomes, strict=True):
            sampler.tell(trial, outcome)
        stored = sampler.study.get_trials(deepcopy=False)
        state = optuna.trial.TrialState
        assert [t.state for t in stored] == [state.COMPLETE, state.FAIL, state.PRUNED]
        assert stored[0].value == pytest.approx(0.9)
        assert stored[0].system_attrs["constraints:0:fidelity.cosine_mean"] == pytest.approx(-0.4)
        with pytest.raises(ValueError, match="not asked"):
            sampler.tell(trials[0], outcomes[0])  # told once
    finally:
        sampler.close()


def test_a_baseline_is_told_once_and_only_when_measured(tmp_path, space):
    sampler = _optuna(tmp_path, space, "tpe")
    try:
        point = space.defaults()[0]
        sampler.tell(Trial(point), Outcome(TrialState.FAILED))
        assert sampler.study.get_trials(deepcopy=False) == []
        sampler.tell(Trial(point), Outcome(TrialState.COMPLETE, 0.95, {"0:fidelity.cosine_mean": -0.45}))
        sampler.tell(Trial(point), Outcome(TrialState.COMPLETE, 0.95, {"0:fidelity.cosine_mean": -0.45}))
        (baseline,) = sampler.study.get_trials(deepcopy=False)
        assert baseline.user_attrs == {"baseline": True} and baseline.value == pytest.approx(0.95)
        assert baseline.params == space.to_optuna(point)
    finally:
        sampler.close()


def test_a_resumed_sampler_returns_what_earlier_runs_finished(tmp_path, space):
    first = _optuna(tmp_path, space, "random", seed=4)
    try:
        finished = []
        for value in (0.1, 0.2):
            trial = first.ask()
            assert trial is not None
            first.tell(trial, Outcome(TrialState.COMPLETE, value))
            finished.append(trial)
        first.ask()  # asked, never told: left RUNNING by this (live) run
    finally:
        first.close()
    second = _optuna(tmp_path, space, "random", seed=4)
    try:
        assert second.resume() == finished
        assert second.study.get_trials(deepcopy=False)[-1].state == optuna.trial.TrialState.RUNNING  # its owner lives
    finally:
        second.close()


@pytest.mark.parametrize("kind", ["random", "tpe", "nsga2", "cmaes"])
def test_the_same_seed_and_history_propose_the_same_points_each_once(tmp_path, space, kind):
    runs = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        sampler = _optuna(tmp_path / folder, space, kind, seed=7)
        try:
            points = []
            while (trial := sampler.ask()) is not None:
                points.append(dict(trial.point))
                sampler.tell(trial, Outcome(TrialState.COMPLETE, float(len(points) % 3)))
                assert len(points) <= 4
            runs.append(points)
        finally:
            sampler.close()
    assert runs[0] == runs[1]
    assert sorted(map(str, runs[0])) == sorted(map(str, space.grid()))  # every point, none twice, then done


def test_a_point_whose_run_died_is_proposed_again_as_the_uninterrupted_run_did(tmp_path, space):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    uninterrupted = []
    (tmp_path / "k").mkdir()
    (tmp_path / "w").mkdir()
    killed = _optuna(tmp_path / "k", space, "tpe", seed=3)
    whole = _optuna(tmp_path / "w", space, "tpe", seed=3)
    try:
        for i in range(3):
            trial = whole.ask()
            uninterrupted.append(dict(trial.point))
            whole.tell(trial, Outcome(TrialState.COMPLETE, float(i)))
        for i in range(2):
            trial = killed.ask()
            killed.tell(trial, Outcome(TrialState.COMPLETE, float(i)))
        left = killed.ask()  # the run dies while processing it
        killed.storage.set_trial_system_attr(killed._asked[left.number][1], OWNER_ATTR, {**owner(), "pid": dead.pid})
    finally:
        killed.close()
        whole.close()
    resumed = _optuna(tmp_path / "k", space, "tpe", seed=3)
    try:
        assert len(resumed.resume()) == 2
        again = resumed.ask()
        assert dict(again.point) == dict(left.point) == uninterrupted[2]
    finally:
        resumed.close()


def test_a_failed_point_is_not_proposed_again(tmp_path, space):
    sampler = _optuna(tmp_path, space, "tpe")
    try:
        asked = []
        while (trial := sampler.ask()) is not None:
            asked.append(str(dict(trial.point)))
            sampler.tell(trial, Outcome(TrialState.FAILED))
        assert sorted(asked) == sorted(map(str, space.grid()))
    finally:
        sampler.close()


def test_an_outcome_has_a_value_exactly_when_complete():
    with pytest.raises(ValueError, match="needs objective value"):
        Outcome(TrialState.COMPLETE)
    with pytest.raises(ValueError, match="has no objective value"):
        Outcome(TrialState.PRUNED, 1.0)
    assert TrialState("failed") is TrialState.FAILED  # a candidate's state names its trial state


def test_samplers_use_only_optunas_public_api():
    engine_dir = Path(engine.search.search.__file__).parent
    for module in ("samplers.py", "trials.py", "search.py"):
        text = (engine_dir / module).read_text()
        assert not re.findall(r"\._(storage|study_id|trial_id|thread_local|cached_frozen_trial)\b", text), module
        assert "runner" not in text or module == "search.py", module
