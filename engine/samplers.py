"""The samplers behind ``search.sampler``, each a ``Sampler`` (engine.core.search): ask → point →
(the engine processes it) → tell.

``grid`` walks the space in order and needs no state. ``random`` and ``tpe`` are optuna's, used
only to propose points, through optuna's public API. Their state lives in an optuna study in the
run database (sqlite in the store, or ``search.storage``), so a run that was killed continues the
same study. Each ask is seeded by a hash of (seed, trial number), so a resumed search proposes what
the uninterrupted one would have, given the same history.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from engine.core.hashing import sha256_json
from engine.core.search import Categorical, Outcome, Trial, TrialState
from engine.space import Point, TargetSpace
from engine.trials import Heartbeat, file_lock, history_length, open_storage, open_study, reclaim_stale

log = logging.getLogger(__name__)
#: consecutive asks that only found points already processed before a sampler is deemed exhausted
MAX_REPEATS = 25


class GridSampler:
    """Every point of the space, in order; each once, so it is never deemed exhausted by repeats."""

    max_repeats: int | None = None

    def __init__(self, space: TargetSpace) -> None:
        self._points = iter(enumerate(space.grid()))

    def resume(self) -> list[Trial]:
        return []

    def ask(self) -> Trial | None:
        asked = next(self._points, None)
        return None if asked is None else Trial(asked[1], asked[0])

    def tell(self, trial: Trial, outcome: Outcome) -> None:
        return None

    def close(self) -> None:
        return None


class OptunaSampler:
    """optuna proposes, the engine disposes: ``kind`` is ``random`` or ``tpe``."""

    max_repeats: int | None = MAX_REPEATS

    def __init__(self, kind: str, space: TargetSpace, storage: str, study_name: str, seed: int, goal: str, lock: Path) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        self.kind = kind
        self.space = space
        self.seed = seed
        self.lock = lock  # serializes study creation and baseline trials between runs sharing the store
        self.storage = open_storage(optuna, storage, lock)
        self.study = open_study(optuna, self.storage, study_name, "maximize" if goal == "max" else "minimize", lock)
        self.study_id = self.storage.get_study_id_from_name(study_name)
        self.heartbeat = Heartbeat(self.storage)
        self._asked: dict[int, tuple[Any, int]] = {}  # trial number → (optuna trial, trial id) this run is processing

    def _sampler(self, number: int) -> Any:
        # one seed per (search seed, trial number), hashed: seed + number would make seed 1's
        # sequence seed 0's shifted by one trial
        seed = int(sha256_json({"seed": self.seed, "trial": number})[:8], 16)
        if self.kind == "random":
            return self.optuna.samplers.RandomSampler(seed=seed)
        # constraints reach TPE through each trial's set_constraint (optuna >= 5)
        return self.optuna.samplers.TPESampler(seed=seed, n_startup_trials=5, multivariate=True)

    def _point(self, params: dict[str, Any]) -> Point:
        """A stored trial's params as a point (choices stored by index turned back to values)."""
        point = dict(params)
        for key, dim in self.space.searched(point):
            if key in point and isinstance(dim.distribution, Categorical) and point[key] not in dim.distribution.choices:
                point[key] = dim.distribution.choices[int(point[key])]
        return point

    def resume(self) -> list[Trial]:
        """The trials earlier runs finished. Then the trials left RUNNING by runs that are gone
        (never by live ones sharing the study) are failed and their points enqueued again, so the
        next asks process them (from the cache): the asks carry them (engine.trials)."""
        state = self.optuna.trial.TrialState
        done = self.study.get_trials(deepcopy=False, states=(state.COMPLETE, state.PRUNED, state.FAIL))
        finished = [Trial(self._point(t.params), t.number) for t in done]
        reclaim_stale(self.optuna, self.study)
        return finished

    def ask(self) -> Trial | None:
        self.study.sampler = self._sampler(history_length(self.study.get_trials(deepcopy=False)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "heartbeat is supposed to be used with optimize"
            trial = self.study.ask()
        trial_id = int(self.storage.get_trial_id_from_study_id_trial_number(self.study_id, trial.number))
        self.heartbeat.claim(trial_id)
        self._asked[trial.number] = (trial, trial_id)
        return Trial(self.space.suggest(trial), trial.number)

    def tell(self, trial: Trial, outcome: Outcome) -> None:
        if trial.number is None:
            self._tell_unasked(trial.point, outcome)
            return
        if trial.number not in self._asked:
            raise ValueError(f"trial {trial.number} was not asked of this sampler (or was told already)")
        asked, trial_id = self._asked.pop(trial.number)
        self.heartbeat.release(trial_id)
        state = self.optuna.trial.TrialState
        try:
            if outcome.state is not TrialState.COMPLETE:
                self.study.tell(asked, state=state.FAIL if outcome.state is TrialState.FAILED else state.PRUNED, skip_if_finished=True)
                return
            for name, slack in outcome.slacks.items():
                asked.set_constraint(name, slack)
            self.study.tell(asked, outcome.value, skip_if_finished=True)
        except self.optuna.exceptions.UpdateFinishedTrialError:
            # a run that took this trial for a dead one's finished it first: same point, same figures
            log.info("trial %s was finished by another run", trial.number)

    def _tell_unasked(self, point: Any, outcome: Outcome) -> None:
        """Tell the study about a point it did not ask for (a baseline), when it lies in the space."""
        point = dict(point)
        distributions = self.space.distributions(point)
        if distributions is None or outcome.state is not TrialState.COMPLETE:
            return
        params = self.space.to_optuna(point)
        with file_lock(self.lock):  # two runs must not both add it
            if any(t.params == params for t in self.study.get_trials(deepcopy=False)):
                return  # told in an earlier run
            told = self.optuna.trial.create_trial(
                params=params,
                distributions=distributions,
                value=outcome.value,
                constraints=dict(outcome.slacks),
                user_attrs={"baseline": True},
            )
            self.study.add_trial(told)

    def close(self) -> None:
        self.heartbeat.close()


def make_sampler(
    kind: str, space: TargetSpace, storage: str, study_name: str, seed: int, goal: str, lock: Path
) -> GridSampler | OptunaSampler:
    """The sampler a workflow's ``search.sampler`` names (``storage``, ``study_name`` and ``lock``
    serve the samplers that keep a study)."""
    if kind == "grid":
        return GridSampler(space)
    return OptunaSampler(kind, space, storage, study_name, seed, goal, lock)
