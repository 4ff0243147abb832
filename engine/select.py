"""Selection: constraints filter, the objective ranks, the Pareto front is marked. Per target."""

from __future__ import annotations

import math

from engine.results import CandidateResult
from engine.workflow.resolve import ResolvedWorkflow
from engine.workflow.schema import Constraint


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def violations(constraint: Constraint, value: float | None, reference: float | None) -> list[str]:
    """What ``value`` breaks of ``constraint`` (empty when it holds)."""
    name = constraint.metric
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return [f"{name} was not measured"]
    broken = []
    if constraint.min is not None and value < constraint.min:
        broken.append(f"{name} = {_fmt(value)} < min {_fmt(constraint.min)}")
    if constraint.max is not None and value > constraint.max:
        broken.append(f"{name} = {_fmt(value)} > max {_fmt(constraint.max)}")
    if constraint.max_drop is not None or constraint.max_drop_ratio is not None:
        if reference is None:
            broken.append(f"{name}: no reference value to measure a drop against")
        else:
            drop = reference - value
            if constraint.max_drop is not None and drop > constraint.max_drop:
                broken.append(f"{name} dropped {_fmt(drop)} from the reference's {_fmt(reference)} (max drop {_fmt(constraint.max_drop)})")
            if constraint.max_drop_ratio is not None and reference != 0 and drop / abs(reference) > constraint.max_drop_ratio:
                broken.append(
                    f"{name} dropped {drop / abs(reference):.2%} from the reference's {_fmt(reference)} (max {constraint.max_drop_ratio:.2%})"
                )
    return broken


def cheap_violations(resolved: ResolvedWorkflow, result: CandidateResult, reference: CandidateResult | None) -> list[str]:
    """Constraints already broken by the figures measured so far (the cheap ones: fidelity,
    accuracy, size), so the candidate need not be timed."""
    if result.candidate.reference:
        return []
    ref_metrics = reference.metrics if reference is not None and reference.state == "complete" else {}
    broken = []
    for constraint in resolved.spec.select.constraints:
        if constraint.metric in result.metrics:
            broken.extend(violations(constraint, result.metrics[constraint.metric], ref_metrics.get(constraint.metric)))
    return broken


def slack(constraint: Constraint, value: float, reference: float | None) -> float:
    """How far ``value`` is past the constraint's bound (<= 0: the constraint holds), as optuna's
    constrained samplers want it."""
    worst = float("-inf")
    if constraint.min is not None:
        worst = max(worst, constraint.min - value)
    if constraint.max is not None:
        worst = max(worst, value - constraint.max)
    if reference is not None and constraint.max_drop is not None:
        worst = max(worst, (reference - value) - constraint.max_drop)
    if reference not in (None, 0) and constraint.max_drop_ratio is not None:
        assert reference is not None
        worst = max(worst, (reference - value) / abs(reference) - constraint.max_drop_ratio)
    return worst if worst != float("-inf") else 0.0


def _directions(resolved: ResolvedWorkflow) -> dict[str, int]:
    """+1: higher is better, -1: lower is better, for the objective and the constrained metrics."""
    select = resolved.spec.select
    directions = {select.objective.metric: 1 if select.objective.goal == "max" else -1}
    for constraint in select.constraints:
        if constraint.metric in directions:
            continue
        lower_bound = constraint.min is not None or constraint.max_drop is not None or constraint.max_drop_ratio is not None
        directions[constraint.metric] = 1 if lower_bound else -1
    return directions


def _dominates(a: CandidateResult, b: CandidateResult, directions: dict[str, int]) -> bool:
    better = False
    for metric, sign in directions.items():
        x, y = a.metrics[metric] * sign, b.metrics[metric] * sign
        if x < y:
            return False
        better |= x > y
    return better


def select(resolved: ResolvedWorkflow, results: list[CandidateResult]) -> None:
    """Mark feasibility, the chosen candidate and the Pareto front of each target, in place."""
    spec = resolved.spec.select
    directions = _directions(resolved)
    for target in resolved.targets:
        mine = [r for r in results if r.candidate.target == target]
        reference = next((r for r in mine if r.candidate.reference and r.state == "complete"), None)
        complete = [r for r in mine if r.state == "complete"]
        for result in complete:
            if not result.untimed:  # an untimed candidate keeps the violations that stopped it
                result.violations = [
                    broken
                    for constraint in spec.constraints
                    for broken in violations(
                        constraint, result.metrics.get(constraint.metric), reference.metrics.get(constraint.metric) if reference else None
                    )
                ]
            result.feasible = not result.violations
        feasible = [r for r in complete if r.feasible and spec.objective.metric in r.metrics]
        if feasible:
            sign = 1 if spec.objective.goal == "max" else -1
            best = max(feasible, key=lambda r: (r.metrics[spec.objective.metric] * sign, r.candidate.reference))
            best.chosen = True
        measured = [r for r in complete if all(m in r.metrics for m in directions)]
        for result in measured:
            result.pareto = not any(_dominates(other, result, directions) for other in measured if other is not result)
