"""The search: which candidates to process, in what order, within what budget.

Per target: the reference first (alone: the other candidates are compared with it; with
``search.reference: false`` it is only made, for the evaluations that compare with it), then the
baselines (each path with the passes' defaults), then the sampler's points until the budget is
spent — ``search.max_candidates``, ``search.max_time_s``, or a ``stop_when`` goal met.

The sampler (engine.search.samplers; the protocol in engine.core.search) only proposes points: the search
processes them and tells the sampler each one's ``Outcome``, computed here from the result.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait

from engine.core.hashing import sha256_json
from engine.core.search import Outcome, Sampler, Trial, TrialState
from engine.core.stats import Interval
from engine.execute.hooks import set_searching_target
from engine.execute.runner import Runner
from engine.plan.planner import Candidate, screening_settings
from engine.search import studies
from engine.search.samplers import OptunaSampler, make_sampler
from engine.search.studies import IDENTITY_ATTR
from engine.search.trials import history_length
from engine.select.results import CandidateResult
from engine.select.select import interval_of, judge, paired_metric, slack
from engine.workflow.resolve import ResolvedWorkflow
from engine.workflow.schema import Objective

#: candidates a streaming search keeps in flight per worker: one running its jobs, one whose
#: timing waits for the machine (engine.execute.gate lets the first take the free worker)
IN_FLIGHT_PER_WORKER = 2


def objective_value(
    resolved: ResolvedWorkflow, result: CandidateResult, reference: CandidateResult | None, objective: Objective | None = None
) -> float:
    """An objective (the first by default) as the sampler is told it. A timing objective measured
    as a paired speedup is the reference's own figure scaled by the candidate's speedup, so a
    candidate timed during a busy minute is not told as slow: the sampler learns what the choice
    is made on."""
    objective = objective or resolved.spec.select.primary
    value = result.metrics[objective.metric]
    paired = paired_metric(resolved, objective.metric)
    if paired is None or paired not in result.metrics or reference is None or objective.metric not in reference.metrics:
        return value
    speedup = result.metrics[paired]
    if speedup <= 0:
        return value
    anchor = reference.metrics[objective.metric]
    return anchor / speedup if objective.goal == "min" else anchor * speedup


def constraint_slacks(resolved: ResolvedWorkflow, result: CandidateResult, reference: CandidateResult | None) -> dict[str, float]:
    """Each constraint's violation (<= 0: it holds), named by its position and metric."""
    values = {}
    for index, constraint in enumerate(resolved.spec.select.constraints):
        value = result.metrics.get(constraint.metric)
        ref = reference.metrics.get(constraint.metric) if reference is not None else None
        values[f"{index}:{constraint.metric}"] = slack(constraint, value, ref) if value is not None else 1.0
    return values


def outcome(resolved: ResolvedWorkflow, result: CandidateResult, reference: CandidateResult | None) -> Outcome:
    """What a sampler is told of a processed candidate: measured (the objective reached) or not."""
    if result.state == "failed":
        return Outcome(TrialState.FAILED)
    objectives = resolved.spec.select.objectives
    if result.state != "complete" or any(o.metric not in result.metrics for o in objectives):
        return Outcome(TrialState.PRUNED)
    values = tuple(objective_value(resolved, result, reference, o) for o in objectives)
    return Outcome(TrialState.COMPLETE, values if len(values) > 1 else values[0], constraint_slacks(resolved, result, reference))


class TargetSearch:
    def __init__(
        self,
        runner: Runner,
        target: str,
        started: float,
        pool: ThreadPoolExecutor,
        sampler: Sampler | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.runner = runner
        self.stop = stop or threading.Event()  # set: another target's search failed or was interrupted
        self._sampler = sampler  # None: the one the workflow's search.sampler names
        self.target = target
        self.started = started
        self.pool = pool
        self.spec = runner.resolved.spec.search
        self.space = runner.plan.spaces[target]
        self.seen: set[str] = set()
        #: session settings (as sha256 of their JSON) that lost clearly on the reference model
        self.pruned_settings: dict[str, str] = {}

    def sampler(self) -> Sampler:
        if self._sampler is not None:
            return self._sampler
        storage = self.spec.storage or f"sqlite:///{self.runner.store.root / 'search.db'}"
        # same steps, search space, sampler and selection → same study, whatever its budget
        ident = studies.identity(self.runner.resolved.spec)
        study = studies.study_name(self.runner.resolved.name, ident, self.target)
        goals = [o.goal for o in self.runner.resolved.spec.select.objectives]
        lock = self.runner.store.root / "locks" / "search.lock"
        sampler = make_sampler(self.spec.sampler, self.space, storage, study, self.spec.seed, goals, lock)
        if isinstance(sampler, OptunaSampler):
            tried = history_length(sampler.study.get_trials(deepcopy=False))
            note = studies.describe(sampler.storage, self.runner.resolved.name, self.target, study, ident, tried)
            if IDENTITY_ATTR not in sampler.study.user_attrs:
                sampler.study.set_user_attr(IDENTITY_ATTR, ident)
            self.runner.hooks.study_opened(self.target, study, note)
        return sampler

    def outcome(self, result: CandidateResult) -> Outcome:
        return outcome(self.runner.resolved, result, self.runner.references.get(self.target))

    def budget_left(self) -> bool:
        if self.stop.is_set():
            return False
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

    def expected(self, has_reference: bool) -> int | None:
        """At most how many candidates this search processes (None: unknown), for progress: the
        reference, the session settings screened on it, the baselines that lie outside the space
        (one inside is a point the sampler would give anyway) and the space's points."""
        size = self.space.size()
        cap = self.spec.max_candidates
        if size is None:
            return cap
        plan, reference = self.runner.plan, self.runner.plan.reference(self.target)
        chains = self.space.chains
        # a path of optional steps skipped is the input model: the reference (and each screening
        # candidate) is then a point of the space already
        in_space = reference is not None and not reference.jobs and bool(chains) and all(s.optional for s in chains[0])
        extra = 0 if in_space else int(has_reference) + len(screening_settings(self.runner.resolved, self.space))
        if self.spec.baselines:
            extra += sum(
                1
                for c in plan.baselines(self.target)
                if c != reference and plan.measured(c) and (c.point is None or not self.space.holds(c.point))
            )
        total = size + extra
        return total if cap is None else min(total, cap)

    def run(self) -> None:
        plan = self.runner.plan
        reference = plan.reference(self.target)
        self.runner.hooks.target_started(self.target, self.expected(reference is not None and self.spec.reference))
        if reference is not None and self.spec.reference:
            self.process_all([reference])
        elif reference is not None:  # search.reference: false
            self.runner.make_reference(reference)
        sampler = self.sampler()
        try:
            self._search(sampler)
        finally:
            sampler.close()

    def _search(self, sampler: Sampler) -> None:
        plan = self.runner.plan
        self._screen_settings()
        baselines = [c for c in plan.baselines(self.target) if c.id not in self.seen and plan.measured(c)] if self.spec.baselines else []
        # the baselines are processed whatever the budget, except max_candidates
        baselines = baselines[: max(0, (self.spec.max_candidates or len(baselines) + 1) - len(self.seen))]
        if getattr(sampler, "independent", False):
            self._stream(sampler, baselines)
            return
        if baselines:
            for baseline, result in zip(baselines, self.process_all(baselines), strict=True):
                if baseline.point is not None:
                    sampler.tell(Trial(baseline.point), self.outcome(result))  # a point it did not propose
        # a resumed search: what earlier runs finished comes back from the cache
        for finished in sampler.resume():
            again = plan.candidate(self.target, dict(finished.point))
            if again is not None and again.id not in self.seen:
                self.process_all([again])
        self._waves(sampler)

    def _upcoming(self, sampler: Sampler, baselines: list[Candidate]) -> Iterator[tuple[Candidate, Trial | None]]:
        """What to process next, in order: the baselines (told as points the sampler did not
        propose), what earlier runs of the search finished (not told), then the sampler's points."""
        plan = self.runner.plan
        for baseline in baselines:
            yield baseline, None if baseline.point is None else Trial(baseline.point)
        for finished in sampler.resume():
            again = plan.candidate(self.target, dict(finished.point))
            if again is not None:
                yield again, None
        while (trial := sampler.ask()) is not None:
            candidate = plan.candidate(self.target, dict(trial.point))
            if candidate is None:
                sampler.tell(trial, Outcome(TrialState.FAILED))
            elif sha256_json(candidate.settings) in self.pruned_settings:
                sampler.tell(trial, Outcome(TrialState.PRUNED))
            else:
                yield candidate, trial

    def _stream(self, sampler: Sampler, baselines: list[Candidate]) -> None:
        """A sampler whose points do not depend on what it is told (the grid): every worker is
        kept busy, the next candidate started as soon as one finishes. In waves, a wave's fast
        candidate (rejected on fidelity in seconds) left its worker idle until the wave's slowest
        (an accuracy-driven quantization, tens of seconds) was done. Twice as many candidates as
        workers are in flight: one whose timing waits for the machine leaves its worker to
        another's jobs (engine.execute.gate), instead of idle until the running pass ends."""
        upcoming = self._upcoming(sampler, baselines)
        most = IN_FLIGHT_PER_WORKER * self.runner.gate.workers
        running: dict[Future[CandidateResult], tuple[str, list[Trial]]] = {}  # candidate id, trials told when it ends
        exhausted = False
        baselines_left = len(baselines)  # the first items: processed whatever the budget, as in waves
        while True:
            while not self.stop.is_set() and not exhausted and len(running) < most and (baselines_left > 0 or self.budget_left()):
                candidate, trial = next(upcoming, (None, None))
                baselines_left -= 1
                if candidate is None:
                    exhausted = True
                    continue
                told = [trial] if trial is not None else []
                in_flight = next((trials for cid, trials in running.values() if cid == candidate.id), None)
                if in_flight is not None:
                    in_flight.extend(told)
                elif candidate.id in self.seen:
                    known = self.runner.results.get(candidate.id)
                    if told and known is not None:
                        sampler.tell(told[0], self.outcome(known))  # a point processed before: what was measured
                else:
                    self.seen.add(candidate.id)
                    running[self.pool.submit(self.runner.process, candidate)] = (candidate.id, told)
            if not running:
                return
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                result = future.result()
                for trial in running.pop(future)[1]:
                    sampler.tell(trial, self.outcome(result))

    def _waves(self, sampler: Sampler) -> None:
        """A sampler that learns from what it is told (TPE, NSGA-II, ...) asks in waves of as many
        points as there are workers and is told the whole wave before it asks again, so what it
        proposes depends on what was measured, never on which candidate happened to finish first:
        the same search chooses the same with one worker or four."""
        plan = self.runner.plan
        repeats = 0
        limit = float("inf") if sampler.max_repeats is None else sampler.max_repeats
        while self.budget_left() and repeats < limit:
            wave: list[tuple[Trial, Candidate]] = []
            while len(wave) < self.runner.gate.workers and len(self.seen) + len(wave) < (self.spec.max_candidates or 1 << 30):
                trial = sampler.ask()
                if trial is None:
                    break
                candidate = plan.candidate(self.target, dict(trial.point))
                if candidate is None:
                    sampler.tell(trial, Outcome(TrialState.FAILED))
                    continue
                if sha256_json(candidate.settings) in self.pruned_settings:
                    # settings that already lost clearly on the reference model are not measured again
                    sampler.tell(trial, Outcome(TrialState.PRUNED))
                    repeats += 1
                    if repeats >= limit:
                        break
                    continue
                if candidate.id in self.seen or any(c.id == candidate.id for _, c in wave):
                    repeats += 1
                    known = self.runner.results.get(candidate.id)
                    if known is not None:
                        sampler.tell(trial, self.outcome(known))  # a repeated point is answered from what was measured
                        if repeats >= limit:
                            break
                        continue
                else:
                    repeats = 0
                wave.append((trial, candidate))
            if not wave:
                break
            results = self.process_all([c for _, c in wave])
            for (trial, _), result in zip(wave, results, strict=True):
                sampler.tell(trial, self.outcome(result))

    def _screen_settings(self) -> None:
        """Try each combination of the target's searched session settings on the reference model
        (the cheapest: its jobs are built), before the sampler. Settings whose paired timing is
        clearly worse there — the whole interval of the speedup over the target's own settings
        below 1 by more than the selection's tie margin (``select.tie_within``) — are pruned: a point the sampler proposes with them is told PRUNED and not built.
        The screening candidates are candidates like any other (the reference model with better
        settings may be the answer)."""
        resolved, plan, space = self.runner.resolved, self.runner.plan, self.space
        paired = paired_metric(resolved, resolved.spec.select.primary.metric)
        screening = [
            c for s in screening_settings(resolved, space) if (c := plan.reference(self.target, s)) is not None and c.id not in self.seen
        ]
        if self.spec.max_candidates is not None:
            screening = screening[: max(0, self.spec.max_candidates - len(self.seen))]
        if not screening:
            return
        confidence = resolved.spec.select.confidence
        # a loss within the selection's practical margin is a tie there, so it prunes nothing here
        bar = 1.0 - (resolved.spec.select.tie_within or 0.0)
        for result in self.process_all(screening):
            if paired is None or result.state != "complete" or paired not in result.metrics:
                continue
            interval = interval_of(result, paired, confidence)
            if interval is None:  # the workflow judges point estimates
                value = result.metrics[paired]
                interval = Interval(value, value, value, 1.0)
            if interval.high < bar:
                shown = ", ".join(f"{k}={v}" for k, v in result.candidate.settings.items())
                note = (
                    f"{self.target}: settings ({shown}) pruned: on the reference model ({result.candidate.id}) {paired} was "
                    f"{interval.estimate:.3g} [{interval.low:.3g}, {interval.high:.3g}] of the target's own settings"
                )
                self.pruned_settings[sha256_json(result.candidate.settings)] = note
                plan.dropped.append(note)


def search(runner: Runner) -> None:
    """Search every target at once, each in a thread of its own: the gate (engine.execute.gate)
    decides what runs, so one target's passes fill the workers another target leaves idle (its
    reference evaluated alone, its timing waiting) instead of waiting for that target to finish;
    a timing still has the machine to itself. Each target's search is sequential in itself, so its
    candidates, their ids and their order are the same as when the targets ran one after another."""
    started = time.perf_counter()
    targets = list(runner.plan.spaces)
    stop = threading.Event()
    if len(targets) <= 1:
        for target in targets:
            _search_target(runner, target, started, stop)
        return
    with ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="kiln-target") as searches:
        running = [searches.submit(_search_target, runner, target, started, stop) for target in targets]
        try:
            done, _ = wait(running, return_when=FIRST_EXCEPTION)
            for future in done:
                future.result()  # what stopped a target's search stops the run
        except BaseException:
            stop.set()  # no target asks for more
            runner.executor.stop()
            raise


def _search_target(runner: Runner, target: str, started: float, stop: threading.Event) -> None:
    set_searching_target(target)
    workers = runner.gate.workers
    pool = ThreadPoolExecutor(
        max_workers=IN_FLIGHT_PER_WORKER * workers,
        thread_name_prefix=f"kiln-{target}",
        initializer=set_searching_target,
        initargs=(target,),
    )
    try:
        TargetSearch(runner, target, started, pool, stop=stop).run()
    except BaseException:
        # interrupted: the pool would wait for its threads' jobs; their workers are killed instead
        stop.set()
        runner.executor.stop()
        raise
    finally:
        pool.shutdown(wait=not stop.is_set(), cancel_futures=stop.is_set())
        set_searching_target(None)
