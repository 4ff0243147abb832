"""The search: which candidates to process, in what order, within what budget.

Per target: the reference first (alone: the other candidates are compared with it), then the
baselines (each path with the passes' defaults), then the sampler's points until the budget is
spent — ``search.max_candidates``, ``search.max_time_s``, or a ``stop_when`` goal met.

Samplers speak ask/tell. ``grid`` walks the space in order and needs no state. ``random`` and
``tpe`` are optuna's, used only to propose points: the engine processes them. Their state lives
in an optuna study in the run database (sqlite in the store, or ``search.storage``), so a run
that was killed continues the same study. Each ask is seeded by a hash of (seed, trial number), so a
resumed search proposes what the uninterrupted one would have, given the same history.
"""

from __future__ import annotations

import logging
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from engine.core.hashing import sha256_json
from engine.core.search import Categorical
from engine.planner import Candidate
from engine.results import CandidateResult
from engine.runner import Runner
from engine.select import judge, paired_metric, slack
from engine.space import Point, TargetSpace
from engine.trials import Heartbeat, file_lock, history_length, open_study, reclaim_stale

log = logging.getLogger(__name__)
#: consecutive asks that only found points already processed before a sampler is deemed exhausted
MAX_REPEATS = 25


def run_id(runner: Runner) -> str:
    """Names the search of this workflow: same steps, search and selection → same study."""
    spec = runner.resolved.spec.model_dump(mode="json", exclude={"output", "cache", "description"})
    return f"{runner.resolved.name}-{sha256_json(spec)[:16]}"


class GridSampler:
    """Every point of the space, in order."""

    def __init__(self, space: TargetSpace) -> None:
        self._points = iter(space.grid())

    def previous(self) -> list[tuple[Any, Point]]:
        return []

    def stale(self) -> list[tuple[Any, Point]]:
        return []

    def ask(self) -> tuple[Any, Point] | None:
        point = next(self._points, None)
        return None if point is None else (None, point)

    def tell(self, token: Any, result: CandidateResult, runner: Runner) -> None:
        return None

    def tell_baseline(self, point: Point, result: CandidateResult, runner: Runner) -> None:
        return None

    def close(self) -> None:
        return None


class OptunaSampler:
    """optuna proposes, the engine disposes: ask → point → (engine processes) → tell."""

    def __init__(self, kind: str, space: TargetSpace, storage: str, study_name: str, seed: int, goal: str, lock: Path) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        self.kind = kind
        self.space = space
        self.seed = seed
        self.lock = lock  # serializes study creation and baseline trials between runs sharing the store
        self.study = open_study(optuna, storage, study_name, "maximize" if goal == "max" else "minimize", lock)
        self.heartbeat = Heartbeat(self.study._storage)

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
        for step in self.space.chain(point):
            for name, dim in step.search.items():
                key = f"{step.id}.{name}"
                if key in point and isinstance(dim.distribution, Categorical) and point[key] not in dim.distribution.choices:
                    point[key] = dim.distribution.choices[int(point[key])]
        return point

    def previous(self) -> list[tuple[Any, Point]]:
        done = (self.optuna.trial.TrialState.COMPLETE, self.optuna.trial.TrialState.PRUNED, self.optuna.trial.TrialState.FAIL)
        return [(t.number, self._point(t.params)) for t in self.study.get_trials(deepcopy=False, states=done)]

    def stale(self) -> list[tuple[Any, Point]]:
        """Trials left RUNNING by runs that are gone (never by live ones sharing the study): they
        are failed and their points enqueued again, so the next asks process them (from the
        cache). Nothing is returned: the asks carry them (engine.trials)."""
        reclaim_stale(self.optuna, self.study)
        return []

    def ask(self) -> tuple[Any, Point] | None:
        self.study.sampler = self._sampler(history_length(self.study.get_trials(deepcopy=False)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "heartbeat is supposed to be used with optimize"
            trial = self.study.ask()
        self.heartbeat.claim(trial._trial_id)
        return trial, self.space.suggest(trial)

    def tell(self, token: Any, result: CandidateResult, runner: Runner) -> None:
        objective = runner.resolved.spec.select.objective.metric
        state = self.optuna.trial.TrialState
        if isinstance(token, self.optuna.trial.Trial):
            self.heartbeat.release(token._trial_id)
        try:
            if result.state != "complete" or objective not in result.metrics:
                self.study.tell(token, state=state.FAIL if result.state == "failed" else state.PRUNED, skip_if_finished=True)
                return
            self._set_constraints(token, _slacks(result, runner))
            self.study.tell(token, objective_value(result, runner), skip_if_finished=True)
        except self.optuna.exceptions.UpdateFinishedTrialError:
            # a run that took this trial for a dead one's finished it first: same point, same figures
            log.info("trial %s was finished by another run", getattr(token, "number", token))

    def close(self) -> None:
        self.heartbeat.close()

    def _set_constraints(self, token: Any, values: dict[str, float]) -> None:
        if isinstance(token, self.optuna.trial.Trial):
            for name, value in values.items():
                token.set_constraint(name, value)
            return
        # a RUNNING trial left by a killed run has no Trial object here, and optuna sets
        # constraints only through one: write the same system attributes through the storage
        storage = self.study._storage
        trial_id = storage.get_trial_id_from_study_id_trial_number(self.study._study_id, token)
        for name, value in values.items():
            storage.set_trial_system_attr(trial_id, f"constraints:{name}", value)

    def tell_baseline(self, point: Point, result: CandidateResult, runner: Runner) -> None:
        """Tell the study about a baseline it did not ask for, when its point lies in the space."""
        objective = runner.resolved.spec.select.objective.metric
        distributions = self.space.distributions(point)
        if distributions is None or result.state != "complete" or objective not in result.metrics:
            return
        params = self.space.to_optuna(point)
        with file_lock(self.lock):  # two runs must not both add it
            if any(t.params == params for t in self.study.get_trials(deepcopy=False)):
                return  # told in an earlier run
            trial = self.optuna.trial.create_trial(
                params=params,
                distributions=distributions,
                value=objective_value(result, runner),
                constraints=_slacks(result, runner),
                user_attrs={"baseline": True},
            )
            self.study.add_trial(trial)


def objective_value(result: CandidateResult, runner: Runner) -> float:
    """The objective as the sampler is told it. A timing objective measured as a paired speedup
    is the reference's own figure scaled by the candidate's speedup, so a candidate timed during a
    busy minute is not told as slow: the sampler learns what the choice is made on."""
    objective = runner.resolved.spec.select.objective
    value = result.metrics[objective.metric]
    paired = paired_metric(runner.resolved, objective.metric)
    reference = runner.references.get(result.candidate.target)
    if paired is None or paired not in result.metrics or reference is None or objective.metric not in reference.metrics:
        return value
    speedup = result.metrics[paired]
    if speedup <= 0:
        return value
    anchor = reference.metrics[objective.metric]
    return anchor / speedup if objective.goal == "min" else anchor * speedup


def _slacks(result: CandidateResult, runner: Runner) -> dict[str, float]:
    """Each constraint's violation (<= 0: it holds), named by its position and metric."""
    reference = runner.references.get(result.candidate.target)
    values = {}
    for index, constraint in enumerate(runner.resolved.spec.select.constraints):
        value = result.metrics.get(constraint.metric)
        ref = reference.metrics.get(constraint.metric) if reference is not None else None
        values[f"{index}:{constraint.metric}"] = slack(constraint, value, ref) if value is not None else 1.0
    return values


class TargetSearch:
    def __init__(self, runner: Runner, target: str, started: float, pool: ThreadPoolExecutor) -> None:
        self.runner = runner
        self.target = target
        self.started = started
        self.pool = pool
        self.spec = runner.resolved.spec.search
        self.space = runner.plan.spaces[target]
        self.seen: set[str] = set()

    def sampler(self) -> GridSampler | OptunaSampler:
        if self.spec.sampler == "grid":
            return GridSampler(self.space)
        storage = self.spec.storage or f"sqlite:///{self.runner.store.root / 'search.db'}"
        study = f"{run_id(self.runner)}/{self.target}"
        goal = self.runner.resolved.spec.select.objective.goal
        lock = self.runner.store.root / "locks" / "search.lock"
        return OptunaSampler(self.spec.sampler, self.space, storage, study, self.spec.seed, goal, lock)

    def budget_left(self) -> bool:
        if self.spec.max_candidates is not None and len(self.seen) >= self.spec.max_candidates:
            return False
        if self.spec.max_time_s is not None and time.perf_counter() - self.started >= self.spec.max_time_s:
            self.runner.hooks.budget_reached(self.target, f"max_time_s={self.spec.max_time_s:g} reached")
            return False
        return not self.goal_met()

    def goal_met(self) -> bool:
        goals = self.spec.stop_when
        if not goals:
            return False

        reference = self.runner.references.get(self.target)
        for result in list(self.runner.results.values()):
            if result.candidate.target != self.target or result.state != "complete" or result.untimed:
                continue
            checks = [*self.runner.resolved.spec.select.constraints, *goals]
            if not any(judge(self.runner.resolved, c, result, reference) for c in checks):
                self.runner.hooks.budget_reached(self.target, f"goal met by {result.candidate.id}")
                return True
        return False

    def process_all(self, candidates: list[Candidate]) -> list[CandidateResult]:
        for candidate in candidates:
            self.seen.add(candidate.id)
        if len(candidates) == 1:
            return [self.runner.process(candidates[0])]
        return list(self.pool.map(self.runner.process, candidates))

    def run(self) -> None:
        plan = self.runner.plan
        reference = plan.reference(self.target)
        if reference is not None:
            self.process_all([reference])
        sampler = self.sampler()
        try:
            self._search(sampler)
        finally:
            sampler.close()

    def _search(self, sampler: GridSampler | OptunaSampler) -> None:
        plan = self.runner.plan
        if self.spec.baselines:
            baselines = [c for c in plan.baselines(self.target) if c.id not in self.seen]
            baselines = baselines[: max(0, (self.spec.max_candidates or len(baselines) + 1) - len(self.seen))]
            for candidate, result in zip(baselines, self.process_all(baselines), strict=True):
                if candidate.point is not None:
                    sampler.tell_baseline(candidate.point, result, self.runner)
        # a resumed search: what earlier runs finished comes back from the cache
        for _, point in sampler.previous():
            candidate = plan.candidate(self.target, point)
            if candidate is not None and candidate.id not in self.seen:
                self.process_all([candidate])
        for token, point in sampler.stale():
            candidate = plan.candidate(self.target, point)
            if candidate is not None:
                sampler.tell(token, self.process_all([candidate])[0], self.runner)
        repeats = 0
        # a grid is finite and visits each point once; only a sampler can keep re-proposing
        limit = float("inf") if isinstance(sampler, GridSampler) else MAX_REPEATS
        while self.budget_left() and repeats < limit:
            wave: list[tuple[Any, Candidate]] = []
            while len(wave) < self.runner.gate.workers and len(self.seen) + len(wave) < (self.spec.max_candidates or 1 << 30):
                asked = sampler.ask()
                if asked is None:
                    break
                token, point = asked
                candidate = plan.candidate(self.target, point)
                if candidate is None:
                    sampler.tell(
                        token, CandidateResult(candidate=Candidate("", self.target, (), {}), label="", state="failed"), self.runner
                    )
                    continue
                if candidate.id in self.seen or any(c.id == candidate.id for _, c in wave):
                    repeats += 1
                    known = self.runner.results.get(candidate.id)
                    if known is not None:
                        sampler.tell(token, known, self.runner)  # a repeated point is answered from what was measured
                        if repeats >= limit:
                            break
                        continue
                else:
                    repeats = 0
                wave.append((token, candidate))
            if not wave:
                break
            results = self.process_all([c for _, c in wave])
            for (token, _), result in zip(wave, results, strict=True):
                sampler.tell(token, result, self.runner)


def search(runner: Runner) -> None:
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=runner.gate.workers, thread_name_prefix="kiln") as pool:
        try:
            for target in runner.plan.spaces:
                TargetSearch(runner, target, started, pool).run()
        except BaseException:
            # interrupted: the pool would wait for its threads' jobs; their workers are killed instead
            stop = getattr(runner.executor, "stop", None)
            if stop is not None:
                stop()
            raise
