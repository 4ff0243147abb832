"""From a resolved workflow to a DAG of jobs and the candidates that run through it.

A job is one pass with one config on one input (and one target, when the pass depends on it).
A candidate is a chain of jobs from the input model to a model a target can run. Candidates
that share a prefix share its jobs, so a step shared by many candidates runs once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from engine.core.hashing import sha256_json
from engine.workflow.resolve import ResolvedWorkflow, Step

INPUT = "input"


@dataclass(frozen=True)
class Job:
    id: str  # sha256 of the job's identity: parent job, step, config, target when it matters
    step_id: str
    parent: str | None  # None: the input model
    config: dict[str, Any] = field(hash=False, compare=False)
    params: dict[str, Any] = field(hash=False, compare=False)  # the searched options' values
    target: str | None = None

    @property
    def label(self) -> str:
        if not self.params:
            return self.step_id
        inner = ", ".join(f"{k}={_show(v)}" for k, v in self.params.items())
        return f"{self.step_id}({inner})"


@dataclass
class Candidate:
    id: str
    target: str
    jobs: tuple[str, ...]
    params: dict[str, Any]  # "<step>.<option>": value; "<step>": "skip" for skipped optional steps
    reference: bool = False


@dataclass
class Plan:
    jobs: dict[str, Job]
    graph: nx.DiGraph
    candidates: list[Candidate]
    skipped_targets: dict[str, str]  # target id -> why it cannot run here
    dropped: list[str] = field(default_factory=list)  # notes on candidate paths left out

    def job_order(self) -> list[str]:
        return [node for node in nx.topological_sort(self.graph) if node != INPUT]

    def label(self, candidate: Candidate) -> str:
        if not candidate.jobs:
            return "input model"
        return " → ".join(self.jobs[j].label for j in candidate.jobs)

    def candidates_of(self, target: str) -> list[Candidate]:
        return [c for c in self.candidates if c.target == target]


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _chains(steps: dict[str, Step], target: str) -> list[list[Step]]:
    """Every root-to-leaf path through the steps that run on ``target``."""
    applies = {sid: s for sid, s in steps.items() if s.targets is None or target in s.targets}
    children: dict[str | None, list[str]] = {}
    for sid, step in applies.items():
        children.setdefault(step.after, []).append(sid)
    chains: list[list[Step]] = []

    def walk(sid: str, prefix: list[Step]) -> None:
        path = [*prefix, applies[sid]]
        kids = children.get(sid, [])
        if not kids:
            chains.append(path)
        for kid in kids:
            walk(kid, path)

    for root in children.get(None, []):
        walk(root, [])
    return chains


def _variants(step: Step) -> list[dict[str, Any] | None]:
    """Each grid point of the step's search space as its params; None means "skip the step"."""
    names = list(step.search)
    points: list[dict[str, Any] | None] = [
        dict(zip(names, values, strict=True)) for values in itertools.product(*(step.search[n] for n in names))
    ]
    if step.optional:
        points.append(None)
    return points


class _Builder:
    """Creates each job once, however many candidates pass through it."""

    def __init__(self) -> None:
        self.graph = nx.DiGraph()
        self.graph.add_node(INPUT)
        self.jobs: dict[str, Job] = {}

    def job(self, parent: str | None, step: Step, params: dict[str, Any], target: str) -> str:
        config = {**step.config, **params}
        job_target = target if step.pass_cls.target_dependent else None
        identity = sha256_json({"parent": parent, "step": step.id, "config": config, "target": job_target})
        if identity not in self.jobs:
            self.jobs[identity] = Job(id=identity, step_id=step.id, parent=parent, config=config, params=params, target=job_target)
            self.graph.add_edge(parent or INPUT, identity)
        return identity

    def label(self, chain: tuple[str, ...]) -> str:
        return " → ".join(self.jobs[j].label for j in chain) or "input model"


def _reference(
    builder: _Builder, resolved: ResolvedWorkflow, chain: list[Step], target: str, accepts: tuple[str, ...]
) -> tuple[tuple[str, ...], str]:
    """The unoptimized model for a target: the first model on its first path that it can run,
    made by the path's non-optional steps with their first search values."""
    jobs: tuple[str, ...] = ()
    fmt = resolved.input.format
    parent: str | None = None
    for step in chain:
        if fmt in accepts:
            break
        if step.optional:
            continue
        parent = builder.job(parent, step, {name: values[0] for name, values in step.search.items()}, target)
        jobs, fmt = (*jobs, parent), step.pass_cls.produces
    return jobs, fmt


def _target_candidates(builder: _Builder, resolved: ResolvedWorkflow, target: str, dropped: list[str]) -> list[Candidate]:
    entry = resolved.targets[target]
    accepts = entry.cls.accepts
    found: dict[tuple[str, ...], Candidate] = {}

    def add(chain_jobs: tuple[str, ...], params: dict[str, Any], fmt: str, reference: bool = False) -> None:
        if fmt not in accepts:
            dropped.append(f"{target}: path {builder.label(chain_jobs)} ends in a {fmt} model, which {entry.cls.runtime} cannot run")
        elif chain_jobs in found:
            found[chain_jobs].reference |= reference
        else:
            found[chain_jobs] = Candidate(id="", target=target, jobs=chain_jobs, params=params, reference=reference)

    chains = _chains(resolved.steps, target)
    ref_jobs, ref_fmt = _reference(builder, resolved, chains[0] if chains else [], target, accepts)
    add(ref_jobs, {}, ref_fmt, reference=True)
    for chain in chains:
        for combo in itertools.product(*(_variants(step) for step in chain)):
            parent: str | None = None
            path: tuple[str, ...] = ()
            params: dict[str, Any] = {}
            fmt = resolved.input.format
            for step, point in zip(chain, combo, strict=True):
                if point is None:
                    params[step.id] = "skip"
                    continue
                parent = builder.job(parent, step, point, target)
                path = (*path, parent)
                params.update({f"{step.id}.{k}": v for k, v in point.items()})
                fmt = step.pass_cls.produces
            add(path, params, fmt)
    ordered = sorted(found.values(), key=lambda c: not c.reference)
    limit = resolved.spec.search.max_candidates
    if limit is not None and len(ordered) > limit:
        dropped.append(f"{target}: {len(ordered) - limit} candidate(s) left out by search.max_candidates={limit}")
        ordered = ordered[:limit]
    for index, candidate in enumerate(ordered):
        candidate.id = f"{target}/{index}"
    return ordered


def build_plan(resolved: ResolvedWorkflow) -> Plan:
    builder = _Builder()
    candidates: list[Candidate] = []
    skipped: dict[str, str] = {}
    dropped: list[str] = []
    for target_id, entry in resolved.targets.items():
        if entry.availability.ok:
            candidates.extend(_target_candidates(builder, resolved, target_id, dropped))
        else:
            skipped[target_id] = entry.availability.reason
    used = {j for c in candidates for j in c.jobs}
    for unused in [j for j in builder.jobs if j not in used]:
        builder.graph.remove_node(unused)
        del builder.jobs[unused]
    return Plan(jobs=builder.jobs, graph=builder.graph, candidates=candidates, skipped_targets=skipped, dropped=dropped)
