"""Trial ownership in a study shared by concurrent runs (issue 9, item 7)."""

from __future__ import annotations

import subprocess
import sys
import time

import optuna
import pytest

from engine.search.trials import OWNER_ATTR, Heartbeat, abandoned, history_length, open_study, owner, reclaim_stale

# these tests ask the study directly, as the engine does (it silences the same warning there)
pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")


@pytest.fixture
def study(tmp_path):
    return open_study(optuna, f"sqlite:///{tmp_path / 'search.db'}", "s", "minimize", tmp_path / "search.lock")


def _running(study, who):
    trial = study.ask()
    study._storage.set_trial_system_attr(trial._trial_id, OWNER_ATTR, who)
    trial.suggest_int("x", 0, 10)
    return trial


def test_a_live_runs_trial_is_left_alone_and_a_dead_runs_is_abandoned(study):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = _running(study, owner())
    gone = _running(study, {**owner(), "pid": dead.pid})
    assert reclaim_stale(optuna, study) == 1
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states[live.number] == optuna.trial.TrialState.RUNNING
    assert states[gone.number] == optuna.trial.TrialState.FAIL
    trials = study.get_trials(deepcopy=False)
    assert [abandoned(t) for t in trials] == [False, True]  # not tried: proposed again (test_samplers)
    assert history_length(trials) == 1
    assert reclaim_stale(optuna, study) == 0  # taken once, by one run


def test_concurrent_runs_create_one_study(tmp_path):
    code = (
        "import optuna, sys; from pathlib import Path; from engine.search.trials import open_study; "
        f"s = open_study(optuna, 'sqlite:///{tmp_path / 'search.db'}', 'shared', 'minimize', Path('{tmp_path / 'search.lock'}')); "
        "print(s._study_id)"
    )
    processes = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)
    ]
    outputs = [p.communicate(timeout=120) for p in processes]
    assert [p.returncode for p in processes] == [0] * 4, [err for _, err in outputs]
    assert len({out.strip() for out, _ in outputs}) == 1


def test_the_heartbeat_marks_trials_as_owned(study):
    beat = Heartbeat(study._storage)
    try:
        trial = study.ask()
        beat.claim(trial._trial_id)
        assert study._storage.get_trial(trial._trial_id).system_attrs[OWNER_ATTR]["pid"] == owner()["pid"]
        time.sleep(0.1)
        assert reclaim_stale(optuna, study) == 0
    finally:
        beat.close()
