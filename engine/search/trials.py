"""Who owns an optuna trial, so many runs can share one study.

A run owns the trials it asked for: each carries the run's owner (host, pid, start time) as a
system attribute, and a heartbeat (optuna's) while the run processes it. A RUNNING trial is taken
over only when its owner is gone: a dead pid on this host, or a heartbeat older than the grace
period (another host, through optuna's ``fail_stale_trials``). Taking over is a claim: the trial
is failed (one run wins that write). Such a trial is *abandoned*: it is neither history nor a known
point, so the next ask proposes from the same history as the run that left it did and, with the
same seed, proposes the same point again (engine.search.samplers). A trial the engine itself fails (a
point whose job failed) carries ``FAILED_ATTR``: that point is known and is not proposed again.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

from engine.store.locks import file_lock, owner, owner_alive

log = logging.getLogger(__name__)

OWNER_ATTR = "kiln:owner"
FAILED_ATTR = "kiln:failed"  # set on a trial before the engine tells it FAIL: its point was tried
HEARTBEAT_S = 5
GRACE_S = 30


def open_storage(optuna: Any, storage_url: str, lock: Path) -> Any:
    """The study database, with optuna's heartbeats (a trial whose heartbeat stopped is failed:
    abandoned); created under ``lock`` (concurrent runs creating its tables at once would collide)."""
    from optuna.storages import RDBStorage

    kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if storage_url.startswith("sqlite") else {}
    with warnings.catch_warnings(), file_lock(lock):
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        return RDBStorage(storage_url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S)


def open_study(optuna: Any, storage: Any, study_name: str, direction: str | list[str], lock: Path) -> Any:
    """Create or load the study (``storage``: a URL, or what ``open_storage`` returned);
    concurrent runs creating it at once both get the same one."""
    if isinstance(storage, str):
        storage = open_storage(optuna, storage, lock)
    with warnings.catch_warnings(), file_lock(lock):
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        for _ in range(5):  # another host may create it between our look and our write
            try:
                directions = [direction] if isinstance(direction, str) else list(direction)
                return optuna.create_study(study_name=study_name, storage=storage, load_if_exists=True, directions=directions)
            except optuna.exceptions.DuplicatedStudyError:
                time.sleep(0.2)
        return optuna.load_study(study_name=study_name, storage=storage)


def abandoned(trial: Any) -> bool:
    """A trial failed because its run went away (not because its point failed), or a trial waiting
    in the queue (an older engine's retry): neither was tried."""
    import optuna

    state = optuna.trial.TrialState
    return trial.state == state.WAITING or (trial.state == state.FAIL and not trial.system_attrs.get(FAILED_ATTR))


def history_length(trials: list[Any]) -> int:
    """How many points the search has tried or is trying: the abandoned trials do not count."""
    return sum(1 for t in trials if not abandoned(t))


def reclaim_stale(optuna: Any, study: Any) -> int:
    """Fail the RUNNING trials whose owner is gone (they become abandoned: see the module)."""
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
        log.info("trial %d of %s was left by a run that is gone; it is proposed again", trial.number, study.study_name)
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
