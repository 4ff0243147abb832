"""The samplers behind ``search.sampler``, each a ``Sampler`` (engine.core.search): ask → point →
(the engine processes it) → tell.

``grid`` walks the space in order and needs no state. ``random`` and ``tpe`` are optuna's, used
only to propose points, through optuna's public API. Their state lives in an optuna study in the
run database (sqlite in the store, or ``search.storage``), so a run that was killed continues the
same study. Each ask is seeded by a hash of (seed, trial number), so a resumed search proposes what
the uninterrupted one would have, given the same history; no point is proposed twice.
"""

from __future__ import annotations

import json
import logging
import random
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.hashing import sha256_json
from engine.core.search import Categorical, Outcome, Trial, TrialState
from engine.plan.space import Point, TargetSpace
from engine.search.trials import (
    FAILED_ATTR,
    OWNER_ATTR,
    Heartbeat,
    abandoned,
    file_lock,
    history_length,
    open_storage,
    open_study,
    reclaim_stale,
)

log = logging.getLogger(__name__)
#: consecutive asks that only found points already processed before a sampler is deemed exhausted
#: (the search's guard: an optuna sampler proposes only untried points, so its repeats are points
#: that differ but make the same candidate)
MAX_REPEATS = 25
#: proposals of the sampler itself before an untried point is drawn instead
ASK_ATTEMPTS = 8
#: then, in a space too large to list, proposals of a random sampler
RANDOM_ATTEMPTS = 64
#: the largest space whose untried points are listed
GRID_LIMIT = 100_000
#: NSGA-II's generation size: small, since a Kiln search evaluates tens of points, not thousands
NSGA2_POPULATION = 8


class GridSampler:
    """Every point of the space, in order; each once, so it is never deemed exhausted by repeats."""

    max_repeats: int | None = None
    #: its points do not depend on what it is told: the search keeps every worker busy
    independent = True

    def __init__(self, space: TargetSpace) -> None:
        self._points = iter(enumerate(space.points()))

    def resume(self) -> list[Trial]:
        return []

    def ask(self) -> Trial | None:
        asked = next(self._points, None)
        return None if asked is None else Trial(asked[1], asked[0])

    def tell(self, trial: Trial, outcome: Outcome) -> None:
        return None

    def close(self) -> None:
        return None


@dataclass(frozen=True)
class Proposal:
    point: Point
    params: dict[str, Any]  # as optuna stores them
    distributions: dict[str, Any]
    attrs: dict[str, Any]  # the sampler's own system attributes of the trial


class OptunaSampler:
    """optuna proposes, the engine disposes: ``kind`` is ``random``, ``tpe``, ``nsga2`` or ``cmaes``.

    A proposal is made on a view of the study: its tried points in the order they were first
    asked, each once, in an in-memory study seeded by (search seed, how many points were tried).
    A point already tried (or being tried) is never proposed again: the sampler is asked again
    with another seed, ``ASK_ATTEMPTS`` times, then the point is drawn among the untried ones
    (seeded). So the budget counts distinct points, and a resumed search asks what the
    uninterrupted one would have: a trial its killed run left is abandoned (engine.search.trials), not
    history."""

    max_repeats: int | None = MAX_REPEATS

    def __init__(self, kind: str, space: TargetSpace, storage: str, study_name: str, seed: int, goal: str | list[str], lock: Path) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        self.kind = kind
        self.space = space
        self.seed = seed
        self.goals = [goal] if isinstance(goal, str) else list(goal)
        self.directions = ["maximize" if g == "max" else "minimize" for g in self.goals]
        self.lock = lock  # serializes study creation, asks and baseline trials between runs sharing the store
        self.storage = open_storage(optuna, storage, lock)
        self.study = open_study(optuna, self.storage, study_name, self.directions, lock)
        self.study_id = self.storage.get_study_id_from_name(study_name)
        self.heartbeat = Heartbeat(self.storage)
        self._asked: dict[int, tuple[Any, int]] = {}  # trial number → (optuna trial, trial id) this run is processing

    def _sampler(self, number: int, attempt: int = 0) -> Any:
        # one seed per (search seed, trial number, attempt), hashed: seed + number would make seed
        # 1's sequence seed 0's shifted by one trial
        seed = int(sha256_json({"seed": self.seed, "trial": number, "attempt": attempt})[:8], 16)
        samplers = self.optuna.samplers
        if self.kind == "random" or attempt >= ASK_ATTEMPTS:
            return samplers.RandomSampler(seed=seed)
        if self.kind == "nsga2":
            return samplers.NSGAIISampler(seed=seed, population_size=NSGA2_POPULATION)
        if self.kind == "cmaes":  # numeric options only: categorical ones are drawn at random
            return samplers.CmaEsSampler(
                seed=seed, n_startup_trials=5, independent_sampler=samplers.RandomSampler(seed=seed), warn_independent_sampling=False
            )
        # constraints reach TPE (and NSGA-II) through each trial's set_constraint (optuna >= 5)
        return samplers.TPESampler(seed=seed, n_startup_trials=5, multivariate=True)

    def _point(self, params: dict[str, Any]) -> Point:
        """A stored trial's params as a point (choices stored by index turned back to values)."""
        point = dict(params)
        for key, dim in self.space.searched(point):
            if key in point and isinstance(dim.distribution, Categorical) and point[key] not in dim.distribution.choices:
                point[key] = dim.distribution.choices[int(point[key])]
        return point

    def resume(self) -> list[Trial]:
        """The trials earlier runs finished (processed again, from the cache). Then the trials left
        RUNNING by runs that are gone (never by live ones sharing the study) are abandoned: the
        next asks propose their points again (engine.search.trials)."""
        state = self.optuna.trial.TrialState
        done = self.study.get_trials(deepcopy=False, states=(state.COMPLETE, state.PRUNED, state.FAIL))
        finished = [Trial(self._point(t.params), t.number) for t in done if not abandoned(t)]
        reclaim_stale(self.optuna, self.study)
        return finished

    def _history(self, trials: list[Any]) -> list[Any]:
        """The trials a proposal learns from: measured or pruned, each point once, in order."""
        state = self.optuna.trial.TrialState
        seen: set[str] = set()
        history = []
        for t in trials:
            key = _key(t.params)
            if t.state not in (state.COMPLETE, state.PRUNED) or key in seen:
                continue
            seen.add(key)
            # the sampler's own state (constraints, NSGA-II's generation, CMA-ES's optimizer), not Kiln's
            attrs = {k: v for k, v in t.system_attrs.items() if not k.startswith("kiln:")}
            history.append(
                self.optuna.trial.create_trial(
                    state=t.state,
                    params=t.params,
                    distributions=t.distributions,
                    values=t.values,
                    system_attrs=attrs,
                    intermediate_values=t.intermediate_values,
                )
            )
        return history

    def _propose(self, history: list[Any], number: int, attempt: int) -> Proposal:
        view = self.optuna.create_study(directions=self.directions, sampler=self._sampler(number, attempt))
        view.add_trials(history)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # samplers' experimental warnings
            warnings.simplefilter("ignore", self.optuna.exceptions.ExperimentalWarning)
            asked = view.ask()
            point = self.space.suggest(asked)
        attrs = view.get_trials(deepcopy=False)[-1].system_attrs  # what the sampler keeps on the trial
        return Proposal(point, dict(asked.params), dict(asked.distributions), dict(attrs))

    def _untried(self, known: set[str], number: int) -> Proposal | None:
        """An untried point of a finite space, drawn with the search's seed; None: all were tried."""
        size = self.space.size()
        if size is None or size > GRID_LIMIT:
            return None
        untried = [p for p in self.space.points() if _key(self.space.to_optuna(p)) not in known]
        if not untried:
            return None
        point = random.Random(sha256_json({"seed": self.seed, "trial": number, "untried": True})).choice(untried)
        distributions = self.space.distributions(point)
        return Proposal(point, self.space.to_optuna(point), distributions, {}) if distributions is not None else None

    def ask(self) -> Trial | None:
        with file_lock(self.lock):  # two runs sharing the study do not propose the same point at once
            trials = self.study.get_trials(deepcopy=False)
            number = history_length(trials)
            known = {_key(t.params) for t in trials if not abandoned(t)}
            history = self._history(trials)
            proposal = None
            for attempt in range(ASK_ATTEMPTS + RANDOM_ATTEMPTS):
                candidate = self._propose(history, number, attempt)
                if _key(candidate.params) not in known:
                    proposal = candidate
                    break
                if attempt + 1 == ASK_ATTEMPTS and (proposal := self._untried(known, number)) is not None:
                    break
            if proposal is None:
                log.info("every point of the space was tried")
                return None
            template = self.optuna.trial.create_trial(
                state=self.optuna.trial.TrialState.RUNNING,
                params=proposal.params,
                distributions=proposal.distributions,
                system_attrs={**proposal.attrs, OWNER_ATTR: self.heartbeat.owner},
            )
            trial_id = int(self.storage.create_new_trial(self.study_id, template_trial=template))
        self.heartbeat.claim(trial_id)
        trial = self.optuna.trial.Trial(self.study, trial_id)
        self._asked[trial.number] = (trial, trial_id)
        return Trial(proposal.point, trial.number)

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
                if outcome.state is TrialState.FAILED:
                    self.storage.set_trial_system_attr(trial_id, FAILED_ATTR, True)  # tried: not abandoned
                self.study.tell(asked, state=state.FAIL if outcome.state is TrialState.FAILED else state.PRUNED, skip_if_finished=True)
                return
            for name, slack in outcome.slacks.items():
                asked.set_constraint(name, slack)
            self.study.tell(asked, outcome.values, skip_if_finished=True)
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
                values=outcome.values,
                constraints=dict(outcome.slacks),
                user_attrs={"baseline": True},
            )
            self.study.add_trial(told)

    def close(self) -> None:
        self.heartbeat.close()


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def make_sampler(
    kind: str, space: TargetSpace, storage: str, study_name: str, seed: int, goal: str | list[str], lock: Path
) -> GridSampler | OptunaSampler:
    """The sampler a workflow's ``search.sampler`` names (``storage``, ``study_name`` and ``lock``
    serve the samplers that keep a study)."""
    if kind == "grid":
        return GridSampler(space)
    return OptunaSampler(kind, space, storage, study_name, seed, goal, lock)
