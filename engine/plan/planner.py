"""From a resolved workflow to a DAG of jobs and the candidates that run through it.

A job is one pass with one config on one input (and one target, when the pass depends on it; or
the part of the target its output depends on, its facet, shared by every target that has it).
A candidate is a chain of jobs from the input model to a model a target can run: a point of the
target's search space (engine.plan.space) made concrete. Candidates that share a prefix share its
jobs, so a step shared by many candidates runs once. The plan grows as samplers propose points.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from engine.core.hashing import sha256_json
from engine.core.search import FloatRange
from engine.plan.jobs import EvalSpec, Key, PassSpec, pass_spec
from engine.plan.space import SESSION, SKIP, Point, TargetSpace, resolved_config
from engine.workflow.resolve import ResolvedWorkflow, Step

INPUT = "input"
#: the most distinct session settings tried each on the reference before the sampler
MAX_SCREENED_SETTINGS = 1_000


@dataclass(frozen=True)
class Job:
    id: str  # sha256 of the job's identity: parent job, step, config, target when it matters
    step_id: str
    parent: str | None  # None: the input model
    config: dict[str, Any] = field(hash=False, compare=False)
    params: dict[str, Any] = field(hash=False, compare=False)  # the searched options' values
    target: str | None = None  # a target-dependent pass's; for a job shared by a facet, the first target planned
    spec: PassSpec | None = field(default=None, hash=False, compare=False, repr=False)  # set by Plan.job

    @property
    def label(self) -> str:
        return _label(self.step_id, self.params)


def _label(step_id: str, params: dict[str, Any]) -> str:
    if not params:
        return step_id
    inner = ", ".join(f"{k}={_show(v)}" for k, v in params.items())
    return f"{step_id}({inner})"


@dataclass
class Candidate:
    id: str
    target: str
    jobs: tuple[str, ...]
    params: dict[str, Any]  # "<step>.<option>": value; "<step>": "skip" for skipped optional steps; "session.<option>"
    reference: bool = False
    point: Point | None = None  # the search-space point it was made from (None: the reference)
    baseline: bool = False
    #: the session settings it runs with where they differ from the target's own options, by
    #: dotted option name ({} : the target as written). A candidate is a model and its settings.
    settings: dict[str, Any] = field(default_factory=dict)
    #: made to try the searched settings on the reference model (the cheapest), before the sampler
    screening: bool = False


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


class Plan:
    """The job DAG and the candidates made so far, per target."""

    def __init__(self, resolved: ResolvedWorkflow) -> None:
        self.resolved = resolved
        self.graph = nx.DiGraph()
        self.graph.add_node(INPUT)
        self.jobs: dict[str, Job] = {}
        self.candidates: list[Candidate] = []
        self.skipped_targets: dict[str, str] = {}
        self.dropped: list[str] = []
        self.spaces: dict[str, TargetSpace] = {}
        self._by_chain: dict[tuple[str, tuple[str, ...], str], Candidate] = {}
        self._fingerprints: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.RLock()  # the targets are searched at once (engine.search): their jobs and candidates are made here
        for target_id, entry in resolved.targets.items():
            if entry.availability.ok:
                self.spaces[target_id] = TargetSpace(resolved, target_id)
            else:
                self.skipped_targets[target_id] = entry.availability.reason

    # -- the DAG --------------------------------------------------------------------------------
    def job(self, parent: str | None, step: Step, params: dict[str, Any], target: str, settings: dict[str, Any] | None = None) -> str:
        """The job of ``step`` with ``params`` after ``parent``, for ``target`` running with
        ``settings``: a target-dependent pass sees the target as the candidate runs it; a pass
        with a facet is shared by every variant with the same facet."""
        with self._lock:
            return self._job(parent, step, params, target, settings)

    def _job(self, parent: str | None, step: Step, params: dict[str, Any], target: str, settings: dict[str, Any] | None) -> str:
        cls = step.pass_cls
        # the searched values over the step's config, typed again as a whole: the same config
        # however each value was reached (config, search or default), so the same key
        step_config = resolved_config(cls, {**step.config, **params})
        settings = settings or {}
        fingerprint = self.fingerprint(target, settings)
        # what of the target the output depends on (Pass.target_facet), asked of that config
        # before the target fills anything in; the job then runs with the options left to the
        # target resolved
        facet = cls.target_facet(step_config, fingerprint)
        config = cls.resolve_for_target(step_config, fingerprint)
        if cls.target_dependent:
            job_target: str | None = target
            document = {"parent": parent, "step": step.id, "config": config, "target": target}
            identity = sha256_json({**document, "settings": settings} if settings else document)
        elif facet is None:
            job_target = None
            identity = sha256_json({"parent": parent, "step": step.id, "config": config, "target": None})
        else:  # one job for every target with this facet; it runs with the first of them
            job_target = target
            identity = sha256_json({"parent": parent, "step": step.id, "config": config, "target": None, "facet": facet})
        if identity not in self.jobs:
            spec = pass_spec(
                self.resolved,
                identity,
                step,
                _label(step.id, params),
                config,
                parent,
                job_target,
                facet if cls.target_dependent else None,
                None if cls.target_dependent else facet,
                settings=settings if job_target is not None else None,
            )
            self.jobs[identity] = Job(
                id=identity, step_id=step.id, parent=parent, config=config, params=params, target=job_target, spec=spec
            )
            self.graph.add_edge(parent or INPUT, identity)
        return identity

    def fingerprint(self, target: str | None, settings: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The fingerprint of the target running with ``settings`` (computed once per plan)."""
        if target is None:
            return None
        known = (target, sha256_json(settings or {}))
        if known not in self._fingerprints:
            entry = self.resolved.targets[target]
            base = entry.fingerprint or entry.instance.fingerprint()
            if settings:
                # a variant differs from its target in its options alone (measured inside the
                # target's environment when it has one: the libraries are the target's)
                options = entry.variant(settings).config.to_json()
                options.pop("id", None)
                options.pop("resources", None)
                options.pop("placement", None)
                base = {**base, "options": options}
            self._fingerprints[known] = base
        return self._fingerprints[known]

    def eval_key(
        self,
        spec: EvalSpec,
        model_digest: str,
        reference_digest: str | None,
        target: str,
        settings: dict[str, Any] | None,
        dataset_keys: dict[str, str],
        file_digest: Callable[[Path], str],
    ) -> Key:
        """An evaluation's key (the run's, and `engine plan`'s) on ``target`` running with
        ``settings``. A candidate with settings is compared with the reference on the target as
        written: that target is part of what the evaluation measured."""
        fingerprint = self.fingerprint(target, settings)
        assert fingerprint is not None
        reference_on = self.fingerprint(target) if settings and reference_digest else None
        return spec.key(model_digest, reference_digest, fingerprint, dataset_keys, file_digest, reference_on)

    def spec(self, job_id: str) -> PassSpec:
        spec = self.jobs[job_id].spec
        assert spec is not None
        return spec

    def depth(self, job_id: str) -> int:
        """How many jobs come before this one on its chain."""
        depth, walker = 0, self.jobs[job_id].parent
        while walker:
            depth, walker = depth + 1, self.jobs[walker].parent
        return depth

    def slot(self, job_id: str, evaluation: str | None = None, target: str | None = None) -> str:
        """A job's place in this workflow, stable when its config changes (for --explain)."""
        chain = []
        current: str | None = job_id
        while current:
            chain.append(self.jobs[current].label)
            current = self.jobs[current].parent
        return sha256_json({"workflow": self.resolved.name, "chain": chain[::-1], "evaluation": evaluation, "target": target})

    def job_order(self) -> list[str]:
        return [node for node in nx.topological_sort(self.graph) if node != INPUT]

    def label(self, candidate: Candidate) -> str:
        text = " → ".join(self.jobs[j].label for j in candidate.jobs) or "input model"
        if candidate.settings:
            text += f" | {_label(SESSION, candidate.settings)}"
        return text

    def candidates_of(self, target: str) -> list[Candidate]:
        return [c for c in self.candidates if c.target == target]

    # -- candidates -----------------------------------------------------------------------------
    def _add(
        self, target: str, jobs: tuple[str, ...], params: dict[str, Any], fmt: str, settings: dict[str, Any], **flags: Any
    ) -> Candidate | None:
        with self._lock:
            return self._add_locked(target, jobs, params, fmt, settings, **flags)

    def _add_locked(
        self, target: str, jobs: tuple[str, ...], params: dict[str, Any], fmt: str, settings: dict[str, Any], **flags: Any
    ) -> Candidate | None:
        entry = self.resolved.targets[target]
        if fmt not in entry.cls.accepts:
            note = f"{target}: path {' → '.join(self.jobs[j].label for j in jobs) or 'input model'} ends in a {fmt} model, which {entry.cls.runtime} cannot run"
            if note not in self.dropped:
                self.dropped.append(note)
            return None
        identity = (target, jobs, sha256_json(settings))
        known = self._by_chain.get(identity)
        if known is not None:
            known.reference |= flags.get("reference", False)
            known.baseline |= flags.get("baseline", False)
            return known
        candidate = Candidate(
            id=f"{target}/{len(self.candidates_of(target))}", target=target, jobs=jobs, params=params, settings=settings, **flags
        )
        self._by_chain[identity] = candidate
        self.candidates.append(candidate)
        return candidate

    def reference(self, target: str, settings: dict[str, Any] | None = None) -> Candidate | None:
        """The unoptimized model on ``target``: the first model on its first path that it can run,
        made by the path's non-optional steps with their configured options. With ``settings``:
        that model running with them (a screening candidate: the settings tried on the cheapest
        model first), else the reference itself."""
        accepts = self.resolved.targets[target].cls.accepts
        space = self.spaces[target]
        jobs: tuple[str, ...] = ()
        fmt = self.resolved.input.format
        parent: str | None = None
        for step in space.chains[0] if space.chains else []:
            if fmt in accepts:
                break
            if step.optional:
                continue
            parent = self.job(parent, step, {}, target, settings)
            jobs, fmt = (*jobs, parent), step.pass_cls.output_format(fmt)
        if settings:
            params = {f"{SESSION}.{name}": value for name, value in settings.items()}
            return self._add(target, jobs, params, fmt, settings, screening=True)
        return self._add(target, jobs, {}, fmt, {}, reference=True)

    def candidate(self, target: str, point: Point, baseline: bool = False) -> Candidate | None:
        """The candidate a point of ``target``'s space stands for (made once, then shared)."""
        space = self.spaces[target]
        parent: str | None = None
        jobs: tuple[str, ...] = ()
        params: dict[str, Any] = {}
        fmt = self.resolved.input.format
        settings = self.resolved.targets[target].settings_of(space.settings(point))
        for step in space.chain(point):
            step_params = space.step_params(step, point)
            if step_params is None:
                params[step.id] = SKIP
                continue
            parent = self.job(parent, step, step_params, target, settings)
            jobs = (*jobs, parent)
            params.update({f"{step.id}.{k}": v for k, v in step_params.items()})
            fmt = step.pass_cls.output_format(fmt)
        params.update({name: value for name, value in point.items() if name.startswith(f"{SESSION}.")})
        candidate = self._add(target, jobs, params, fmt, settings, point=point, baseline=baseline)
        if candidate is not None and candidate.point is None:
            candidate.point = point
        return candidate

    def measured(self, candidate: Candidate) -> bool:
        """Whether the search measures ``candidate``: all but a reference left unmeasured
        (``search.reference: false``) that is no baseline or point of the space too."""
        return self.resolved.spec.search.reference or not candidate.reference or candidate.baseline or candidate.point is not None

    def baselines(self, target: str) -> list[Candidate]:
        """The reference, then each path with every step at its configured (library) defaults."""
        found = [self.reference(target)] + [self.candidate(target, point, baseline=True) for point in self.spaces[target].defaults()]
        unique: list[Candidate] = []
        for candidate in found:
            if candidate is not None and candidate not in unique:
                unique.append(candidate)
        return unique

    def prune_unused(self) -> None:
        used = {j for c in self.candidates for j in c.jobs}
        for unused in [j for j in self.jobs if j not in used]:
            self.graph.remove_node(unused)
            del self.jobs[unused]


def build_plan(resolved: ResolvedWorkflow, limit: int | None = None) -> Plan:
    """Every candidate the grid sampler runs, in the order the search processes them (what
    `engine plan` shows): per target the reference, the searched session settings on it, the
    baselines (each path at its configured defaults, when ``search.baselines``), then every
    point of the space. ``limit`` caps the candidates per target (default: ``max_candidates``),
    counted as the search counts them."""
    plan = Plan(resolved)
    limit = limit if limit is not None else resolved.spec.search.max_candidates
    for target, space in plan.spaces.items():
        room = _Room(plan, target, limit)
        plan.reference(target)
        for settings in screening_settings(resolved, space):  # tried on the reference model first (engine.search.search)
            if room.full():
                break
            plan.reference(target, settings)
        if resolved.spec.search.baselines:
            for point in space.defaults():
                if room.full():
                    break
                plan.candidate(target, point, baseline=True)
        for point in space.points():
            if room.full():
                plan.dropped.append(
                    f"{target}: the grid has {space.grid_size():,} points; search.max_candidates={limit} keeps the first ones"
                )
                break
            plan.candidate(target, point)
    plan.prune_unused()
    return plan


@dataclass
class _Room:
    """Whether a target's candidates reached the cap (None: no cap)."""

    plan: Plan
    target: str
    limit: int | None

    def full(self) -> bool:
        return self.limit is not None and sum(map(self.plan.measured, self.plan.candidates_of(self.target))) >= self.limit


def screening_settings(resolved: ResolvedWorkflow, space: TargetSpace) -> list[dict[str, Any]]:
    """The distinct settings of a target's searched session settings other than its own, in grid
    order: what the search tries on the reference model before the sampler. None for a continuous
    range, nor when the reference is not measured (``search.reference: false``)."""
    if not resolved.spec.search.reference:
        return []  # the reference model is not measured, with these settings or others
    if not space.settings_dims or any(isinstance(d.distribution, FloatRange) for d in space.settings_dims.values()):
        return []
    entry = resolved.targets[space.target]
    found: dict[str, dict[str, Any]] = {}
    if space.settings_size() > MAX_SCREENED_SETTINGS:
        return []  # too many to try each on the reference: the sampler draws among them
    for point in space.settings_points():
        settings = entry.settings_of(space.settings(point))
        if settings:
            found.setdefault(sha256_json(settings), settings)
    return list(found.values())
