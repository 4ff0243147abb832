"""From a parsed workflow to a resolved one: plugins found by name, configs typed, references
checked, paths found. Every problem is collected; all of them are raised together.

The package: ``parts`` types the workflow part by part, ``plugins`` finds plugins and validates
their options (shared with ``engine schema``), ``inputs``, ``sections``, ``steps`` and ``search``
resolve each part, ``checks`` holds the cross-reference checks (each returns its problems).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError

from engine.core.errors import InputError, Problem
from engine.core.search import flatten
from engine.workflow.problems import problems_from_validation
from engine.workflow.resolve.checks import input_tokenizers, metric_refs, session_name_free
from engine.workflow.resolve.inputs import WEIGHT_FILES, fetch_input, resolve_input, token_problems
from engine.workflow.resolve.model import DataEntry, EvaluatorEntry, InputModel, ResolvedWorkflow, Step, TargetEntry
from engine.workflow.resolve.model_checks import model_kind_problems
from engine.workflow.resolve.parts import parts_of
from engine.workflow.resolve.search import GRID_CHECK_LIMIT
from engine.workflow.resolve.sections import resolve_data, resolve_evaluators, resolve_targets
from engine.workflow.resolve.sizes import chains_for, space_size
from engine.workflow.resolve.steps import resolve_steps
from engine.workflow.schema import SINGLE_OBJECTIVE_SAMPLERS, TOP_LEVEL_KEYS, Workflow
from engine.workflow.source import WorkflowSource, read_workflow


def resolve(source: WorkflowSource) -> ResolvedWorkflow:
    """Check everything that can be checked without running anything; raise all problems at once."""
    problems: list[Problem] = []
    spec: Workflow | None = None
    data = source.data
    tokens, scrubbed = token_problems(data.get("input") if isinstance(data, dict) else None, source)
    if tokens:  # refused, and the rest checked without them: no message echoes a token
        problems.extend(tokens)
        data = {**data, "input": scrubbed}
    try:
        spec = Workflow.model_validate(data)
    except ValidationError as error:
        problems.extend(problems_from_validation(error, source, (), Workflow, "the workflow"))
    parts = parts_of(data if isinstance(data, dict) else {})
    datasets = resolve_data(parts, source, problems)
    targets = resolve_targets(parts, source, problems)
    input_model = None if tokens else resolve_input(parts.input, source, problems)
    reported = {p.where.split(".")[1] for p in problems if p.where.startswith("data.")}
    problems.extend(input_tokenizers({k: v for k, v in datasets.items() if k not in reported}, input_model, source))
    steps = resolve_steps(parts, input_model, source, problems)
    problems.extend(model_kind_problems(parts.raw_steps, steps, input_model, source))
    evaluators = resolve_evaluators(parts, source, problems)
    if len(evaluators) == parts.evaluate_count:  # metrics of an evaluation that failed are not known
        problems.extend(metric_refs(parts.metrics, evaluators, source))
    problems.extend(session_name_free(steps, targets, source))
    if spec is not None:
        problems.extend(sampler_objectives(spec, source))
        problems.extend(drops_need_reference(spec, source))
    if problems:
        raise InputError(problems)
    assert spec is not None and input_model is not None
    resolved = ResolvedWorkflow(
        file=source.file, spec=spec, input=input_model, steps=steps, targets=targets, evaluators=evaluators, datasets=datasets
    )
    problems.extend(grid_too_large(resolved, source))
    if problems:
        raise InputError(problems)
    return resolved


#: the most points a grid search visits without ``search.max_candidates``
MAX_GRID_POINTS = 100_000


def grid_too_large(resolved: ResolvedWorkflow, source: WorkflowSource) -> list[Problem]:
    """A grid search with no ``max_candidates`` visits every point: a space larger than
    MAX_GRID_POINTS is refused (its size is counted, never listed)."""
    search = resolved.spec.search
    if search.sampler != "grid" or search.max_candidates is not None:
        return []
    problems = []
    for target, entry in resolved.targets.items():
        size = space_size(chains_for(resolved.steps, target), dict(entry.search), flatten(entry.instance.config.model_dump(mode="json")))
        if size > MAX_GRID_POINTS:
            problems.append(
                source.problem(
                    ("search", "sampler"),
                    f"the grid search visits every point, and target '{target}' has a space of {size:,} points",
                    expected=f"at most {MAX_GRID_POINTS:,} points for a grid with no search.max_candidates",
                    given=f"{size:,} points",
                    hint="set search.max_candidates (the grid keeps the first points), use sampler: random or tpe, or narrow the ranges",
                )
            )
    return problems


def sampler_objectives(spec: Workflow, source: WorkflowSource) -> list[Problem]:
    """A sampler that optimizes one objective cannot run a search with several."""
    sampler, count = spec.search.sampler, len(spec.select.objectives)
    if count < 2 or sampler not in SINGLE_OBJECTIVE_SAMPLERS:
        return []
    return [
        source.problem(
            ("search", "sampler"),
            f"the sampler '{sampler}' optimizes one objective, and `select.objective` lists {count}",
            expected="a sampler for several objectives: " + ", ".join(s for s in ("grid", "random", "tpe", "nsga2") if s != sampler),
            given=sampler,
            hint="use `sampler: tpe` or `sampler: nsga2`, or keep one objective (the others can be constraints)",
        )
    ]


def load_workflow(file: Path | str) -> ResolvedWorkflow:
    """Read, validate and resolve a workflow file. Raises InputError listing every problem."""
    return resolve(read_workflow(Path(file)))


def default_store_dir(resolved: ResolvedWorkflow) -> Path:
    if resolved.spec.cache.dir:
        return (resolved.base_dir / resolved.spec.cache.dir).resolve()
    if os.environ.get("KILN_STORE"):
        return Path(os.environ["KILN_STORE"]).expanduser().resolve()
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache_home / "kiln"


__all__ = [
    "GRID_CHECK_LIMIT",
    "TOP_LEVEL_KEYS",
    "WEIGHT_FILES",
    "DataEntry",
    "EvaluatorEntry",
    "InputModel",
    "ResolvedWorkflow",
    "Step",
    "TargetEntry",
    "default_store_dir",
    "fetch_input",
    "load_workflow",
    "resolve",
]


def drops_need_reference(spec: Workflow, source: WorkflowSource) -> list[Problem]:
    """A drop (max_drop, max_drop_ratio) is measured from the reference: not with ``search.reference: false``."""
    if spec.search.reference:
        return []
    found = [
        ((*section, index, bound), constraint.metric, bound)
        for section, constraints in ((("select", "constraints"), spec.select.constraints), (("search", "stop_when"), spec.search.stop_when))
        for index, constraint in enumerate(constraints)
        for bound in ("max_drop", "max_drop_ratio")
        if getattr(constraint, bound) is not None
    ]
    return [
        source.problem(
            where,
            f"{bound} on {metric} is a drop from the reference, and `search.reference: false` leaves the reference unmeasured",
            expected="min or max bounds (absolute), or search.reference: true",
            given=f"{bound} with search.reference: false",
            hint=f"measure the reference (remove `search.reference: false`), or bound {metric} with min / max",
        )
        for where, metric, bound in found
    ]
