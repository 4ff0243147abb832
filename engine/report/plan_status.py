"""What `engine plan` shows, as data: per pass job whether the store has it (and, for a miss,
what changed in its key since the last run), per candidate which evaluations the store has.
Nothing runs; the CLI only renders the ``PlanStatus``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.artifact import ModelArtifact
from engine.execute.datasets import Datasets, input_artifact
from engine.execute.evaluation import candidate_evaluations
from engine.execute.stages import first_look
from engine.plan.jobs import EvalSpec
from engine.plan.keys import explain
from engine.plan.planner import Candidate, Plan, build_plan
from engine.plan.space import SESSION
from engine.store.store import Store
from engine.workflow.resolve import ResolvedWorkflow

HIT, MISS, BLOCKED = "hit", "miss", "blocked"  # blocked: its input is not built yet, so no key


@dataclass(frozen=True)
class SpaceStatus:
    target: str
    size: int | None  # None: infinitely many points (a float range)
    paths: int
    dimensions: tuple[str, ...]


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    label: str
    depth: int  # jobs before it on its chain
    state: str  # hit | miss | blocked
    key: str | None = None
    #: for a miss: the key fields that changed since the last run of this slot ([]: none, its
    #: result was removed); None: never run before
    changed: tuple[str, ...] | None = None


@dataclass(frozen=True)
class CandidateStatus:
    id: str
    label: str
    reference: bool
    evaluations: dict[str, str]  # evaluation id -> hit | miss
    baseline: bool = False  # a path at its configured defaults, run before the searched points
    measured: bool = True  # False: a reference made for the evaluations that compare with it (search.reference: false)


@dataclass(frozen=True)
class PlanStatus:
    workflow: str
    input: ModelArtifact
    store: Path
    search: Any  # the workflow's search section
    spaces: tuple[SpaceStatus, ...]
    job_count: int
    candidate_count: int
    skipped_targets: dict[str, str]
    jobs: tuple[JobStatus, ...]  # in topological order
    candidates: dict[str, tuple[CandidateStatus, ...]]  # by target, targets with candidates only
    evaluations: int  # evaluations per candidate
    dropped: tuple[str, ...] = field(default=())


def explain_plan(resolved: ResolvedWorkflow, store: Store, plan: Plan | None = None) -> PlanStatus:
    """The plan (the full grid unless ``plan`` is given) against what ``store`` holds."""
    store = store.ensure()
    plan = plan or build_plan(resolved)
    if resolved.input.hub is not None and not resolved.input.hub.present:  # engine run downloads it: no digest yet
        model = ModelArtifact(format=resolved.input.format, path=resolved.input.path, digest="", attrs=dict(resolved.input.attrs))
    else:
        model = input_artifact(resolved, store)
    datasets = Datasets(resolved, store, model)
    digests: dict[str, str | None] = {}
    jobs = tuple(_job_status(plan, store, datasets, model, job_id, digests) for job_id in plan.job_order())
    specs = candidate_evaluations(resolved)
    candidates = {}
    for target in resolved.targets:
        found = plan.candidates_of(target)
        if found:
            candidates[target] = _candidate_statuses(plan, store, datasets, model, specs, found, digests)
    return PlanStatus(
        workflow=resolved.name,
        input=model,
        store=store.root,
        search=resolved.spec.search,
        spaces=tuple(_space_status(plan, target) for target in plan.spaces),
        job_count=len(plan.jobs),
        candidate_count=len(plan.candidates),
        skipped_targets=dict(plan.skipped_targets),
        jobs=jobs,
        candidates=candidates,
        evaluations=len(specs),
        dropped=tuple(plan.dropped),
    )


def _space_status(plan: Plan, target: str) -> SpaceStatus:
    space = plan.spaces[target]
    steps = [step for chain in space.chains for step in chain]
    dims = {f"{s.id}.{o}" for s in steps for o in s.search} | {s.id for s in steps if s.optional}
    settings = tuple(f"{SESSION}.{name}" for name in space.settings_dims)
    return SpaceStatus(target=target, size=space.size(), paths=len(space.chains), dimensions=(*sorted(dims), *settings))


def _job_status(
    plan: Plan, store: Store, datasets: Datasets, model: ModelArtifact, job_id: str, digests: dict[str, str | None]
) -> JobStatus:
    job = plan.jobs[job_id]
    parent = (model.digest or None) if job.parent is None else digests.get(job.parent)  # "": the input is not downloaded yet
    depth = plan.depth(job_id)
    if parent is None:
        digests[job_id] = None
        return JobStatus(job_id, job.label, depth, BLOCKED)
    key, doc = plan.spec(job_id).key(parent, datasets.keys, model.digest)
    record = store.lookup(key)
    digests[job_id] = record["digest"] if record else None
    if record:
        return JobStatus(job_id, job.label, depth, HIT, key)
    previous = store.recall(plan.slot(job_id))
    changed = None if previous is None else tuple(explain(previous.get("key_doc") or {}, doc))
    return JobStatus(job_id, job.label, depth, MISS, key, changed)


def _candidate_statuses(
    plan: Plan,
    store: Store,
    datasets: Datasets,
    model: ModelArtifact,
    specs: list[EvalSpec],
    candidates: list[Candidate],
    digests: dict[str, str | None],
) -> tuple[CandidateStatus, ...]:
    out = []
    reference_digest = None
    for candidate in candidates:
        model_digest = (model.digest or None) if not candidate.jobs else digests.get(candidate.jobs[-1])
        if candidate.reference:
            reference_digest = model_digest
        marks = {}
        for spec in specs if plan.measured(candidate) else []:  # a reference made, not measured: its jobs only
            if model_digest is None or (spec.needs_reference and not candidate.reference and reference_digest is None):
                marks[spec.id] = MISS
                continue
            against = None if candidate.reference else reference_digest
            # a staged evaluation is answered by its first look alone where that look decided
            looks = [first for first in [first_look(plan.resolved, spec, candidate.reference)] if first is not None]
            if spec.as_written is not None:  # a stricter measurement answers it too (engine.execute.evaluation.to_the_decision)
                looks.append(spec.as_written)
            hit = False
            for look in [spec, *looks]:
                key, _ = plan.eval_key(
                    look,
                    model_digest,
                    against,
                    candidate.target,
                    candidate.settings,
                    datasets.keys,
                    lambda p: store.cached_digest(p, "file"),
                )
                hit = hit or store.lookup(key) is not None
            marks[spec.id] = HIT if hit else MISS
        out.append(
            CandidateStatus(candidate.id, plan.label(candidate), candidate.reference, marks, candidate.baseline, plan.measured(candidate))
        )
    return tuple(out)
