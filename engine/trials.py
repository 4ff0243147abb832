"""Who owns an optuna trial, so many runs can share one study.

A run owns the trials it asked for: each carries the run's owner (host, pid, start time) as a
system attribute, and a heartbeat (optuna's) while the run processes it. A RUNNING trial is taken
over only when its owner is gone: a dead pid on this host, or a heartbeat older than the grace
period (another host, through optuna's ``fail_stale_trials``). Taking over is a claim: the trial
is failed (one run wins that write) and its point is enqueued again, as optuna's retry callbacks
do but without the dead owner, so the next ``ask`` of any run pops it and answers it (from the
cache).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger(__name__)

OWNER_ATTR = "kiln:owner"
HEARTBEAT_S = 5
GRACE_S = 30


def owner() -> dict[str, Any]:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "started": psutil.Process(pid).create_time()}


def owner_alive(who: dict[str, Any]) -> bool | None:
    """True / False for an owner on this host; None when only its host could tell."""
    if who.get("host") != socket.gethostname():
        return None
    try:
        return abs(psutil.Process(int(who["pid"])).create_time() - float(who["started"])) <= 1.0
    except (psutil.NoSuchProcess, KeyError, TypeError, ValueError):
        return False


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock between the processes of this host (study creation, baseline trials)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def open_storage(optuna: Any, storage_url: str, lock: Path) -> Any:
    """The study database, with optuna's heartbeats and the retry of trials whose run is gone;
    created under ``lock`` (concurrent runs creating its tables at once would collide)."""
    from optuna.storages import RDBStorage

    kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if storage_url.startswith("sqlite") else {}
    # optuna < 5 names the stale-trial callback failed_trial_callback
    callback = "heartbeat_stale_trial_callback" if optuna.__version__ >= "5" else "failed_trial_callback"
    with warnings.catch_warnings(), file_lock(lock):
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        return RDBStorage(storage_url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S, **{callback: retry})


def open_study(optuna: Any, storage: Any, study_name: str, direction: str, lock: Path) -> Any:
    """Create or load the study (``storage``: a URL, or what ``open_storage`` returned);
    concurrent runs creating it at once both get the same one."""
    if isinstance(storage, str):
        storage = open_storage(optuna, storage, lock)
    with warnings.catch_warnings(), file_lock(lock):
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        for _ in range(5):  # another host may create it between our look and our write
            try:
                return optuna.create_study(study_name=study_name, storage=storage, load_if_exists=True, direction=direction)
            except optuna.exceptions.DuplicatedStudyError:
                time.sleep(0.2)
        return optuna.load_study(study_name=study_name, storage=storage)


def history_length(trials: list[Any]) -> int:
    """How many trials the search has made, not counting those taken over (their retry counts)."""
    replaced = {t.system_attrs["failed_trial"] for t in trials if "failed_trial" in t.system_attrs}
    return len(trials) - len(replaced)


def retry(study: Any, trial: Any) -> None:
    """Enqueue a taken-over trial's point again (optuna's retry callback, minus the dead owner)."""
    import optuna

    system_attrs = {k: v for k, v in trial.system_attrs.items() if k != OWNER_ATTR}
    system_attrs["failed_trial"] = system_attrs.get("failed_trial", trial.number)
    system_attrs["retry_history"] = [*system_attrs.get("retry_history", []), trial.number]
    study.add_trial(
        optuna.create_trial(
            state=optuna.trial.TrialState.WAITING,
            params=trial.params,
            distributions=trial.distributions,
            user_attrs=trial.user_attrs,
            system_attrs=system_attrs,
        )
    )


def reclaim_stale(optuna: Any, study: Any) -> int:
    """Fail the RUNNING trials whose owner is gone and enqueue their points again."""
    from optuna.storages import fail_stale_trials

    taken = 0
    now = datetime.now()
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        who = trial.system_attrs.get(OWNER_ATTR)
        if who is not None:
            gone = owner_alive(who) is False
        else:  # asked by an engine that did not say who it was: gone once past the grace period
            gone = trial.datetime_start is not None and (now - trial.datetime_start).total_seconds() > GRACE_S
        if not gone:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "heartbeat is supposed to be used with optimize"
                study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        except (ValueError, optuna.exceptions.UpdateFinishedTrialError):
            continue  # another run took it over first (finished before our look, or between look and write)
        retry(study, trial)
        log.info("trial %d of %s was left by a run that is gone; its point is asked again", trial.number, study.study_name)
        taken += 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        fail_stale_trials(study)  # other hosts' trials whose heartbeat stopped
    return taken


class Heartbeat:
    """Records optuna heartbeats for the trials this run is processing, and marks them as ours."""

    def __init__(self, storage: Any) -> None:
        self.storage = storage
        self.owner = owner()
        self._trials: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="kiln-heartbeat", daemon=True)
        self._thread.start()

    def claim(self, trial_id: int) -> None:
        self.storage.set_trial_system_attr(trial_id, OWNER_ATTR, self.owner)
        self.storage.record_heartbeat(trial_id)
        with self._lock:
            self._trials.add(trial_id)

    def release(self, trial_id: int) -> None:
        with self._lock:
            self._trials.discard(trial_id)

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with self._lock:
                trials = list(self._trials)
            for trial_id in trials:
                try:
                    self.storage.record_heartbeat(trial_id)
                except Exception as error:  # noqa: BLE001 - a missed beat is retried; never kill the run for it
                    log.warning("could not record the heartbeat of trial %d: %s", trial_id, error)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=HEARTBEAT_S + 1)
