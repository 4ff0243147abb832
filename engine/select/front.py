"""Selection with several objectives (``select.objective`` as a list): the feasible candidates not
dominated on the objectives form the Pareto front, which is the result (``pareto: true`` in
candidates.json; ``output.keep: pareto`` writes their models), and ``select.choose`` picks the
one model the run answers with:

- ``first``: the best of the front on the first objective, judged as a single objective is
  (intervals, ``tie_within``), ties broken by the next objectives (each on a measurable or material
  difference, as engine.select.ties says), then ``select.tie_break``;
- ``{weights: [...]}``: the highest weighted sum of log ratios to the reference, each objective
  turned so that higher is better (twice as fast and half the size weigh the same).

A timing objective is compared through its paired figure (latency's speedup), as with one
objective, so candidates timed minutes apart are compared on what was measured side by side.
"""

from __future__ import annotations

import math

from engine.select.results import CandidateResult
from engine.select.select import _choose, _fmt, metric_rule, paired_metric, select
from engine.workflow.resolve import ResolvedWorkflow
from engine.workflow.schema import Weights


def _axes(resolved: ResolvedWorkflow, results: list[CandidateResult]) -> list[tuple[str, int]]:
    """Per objective, the metric it is compared on and +1 (higher is better) or -1."""
    axes = []
    for objective in resolved.spec.select.objectives:
        paired = paired_metric(resolved, objective.metric)
        if paired and results and all(paired in r.metrics for r in results):
            axes.append((paired, 1))
        else:
            axes.append((objective.metric, 1 if objective.goal == "max" else -1))
    return axes


def _dominates(a: CandidateResult, b: CandidateResult, axes: list[tuple[str, int]]) -> bool:
    pairs = [(a.metrics[m] * s, b.metrics[m] * s) for m, s in axes]
    return all(x >= y for x, y in pairs) and any(x > y for x, y in pairs)


def pareto_front(feasible: list[CandidateResult], axes: list[tuple[str, int]]) -> list[CandidateResult]:
    return [r for r in feasible if not any(_dominates(o, r, axes) for o in feasible if o is not r)]


def _score(value: float, anchor: float, sign: int) -> float:
    """log(value / anchor), turned so that higher is better."""
    return sign * math.log(value / anchor)


def _weighted(resolved: ResolvedWorkflow, front: list[CandidateResult], reference: CandidateResult | None, weights: Weights) -> None:
    axes = _axes(resolved, front)
    scores = {r.candidate.id: 0.0 for r in front}
    parts: dict[str, list[str]] = {r.candidate.id: [] for r in front}
    for (metric, sign), weight in zip(axes, weights.weights, strict=True):
        values = [r.metrics[metric] for r in front]
        anchor = reference.metrics.get(metric) if reference is not None else None
        if anchor is None or anchor <= 0:
            anchor = max(values) if sign > 0 else min(values)  # the front's best as the yardstick
        for r in front:
            value = r.metrics[metric]
            if value <= 0 or anchor <= 0:  # no ratio: min-max scaled instead
                low, high = min(values), max(values)
                score = 0.0 if high == low else sign * (value - low) / (high - low)
            else:
                score = _score(value, anchor, sign)
            scores[r.candidate.id] += weight * score
            parts[r.candidate.id].append(f"{metric} {_fmt(value)}")
    best = max(front, key=lambda r: scores[r.candidate.id])
    best.chosen = True
    label = f"#{best.candidate.id.split('/')[-1]}"
    weights_text = ", ".join(_fmt(w) for w in weights.weights)
    for r in front:
        mine = f"weighted score {scores[r.candidate.id]:+.3f} ({'; '.join(parts[r.candidate.id])})"
        if r is best:
            r.verdict = f"on the Pareto front; the highest {mine}, weights {weights_text} on log ratios to the reference"
        else:
            r.verdict = f"on the Pareto front; {mine}, below the chosen {label}'s {scores[best.candidate.id]:+.3f}"


def choose_from_front(
    resolved: ResolvedWorkflow, feasible: list[CandidateResult], order: dict[str, int], reference: CandidateResult | None
) -> None:
    """Mark the front (``pareto``), the chosen candidate and every feasible candidate's verdict."""
    measured = [r for r in feasible if all(o.metric in r.metrics for o in resolved.spec.select.objectives)]
    axes = _axes(resolved, measured)
    front = pareto_front(measured, axes)
    for result in measured:
        result.pareto = result in front
    if not front:
        return
    choose = resolved.spec.select.choose
    if isinstance(choose, Weights):
        _weighted(resolved, front, reference, choose)
    else:
        extra = [metric_rule(resolved, metric, sign) for metric, sign in _axes(resolved, front)[1:]]
        _choose(resolved, front, order, extra)
    for result in measured:
        if result not in front:
            by = next(o for o in front if _dominates(o, result, axes))
            shown = ", ".join(f"{m} {_fmt(result.metrics[m])} vs {_fmt(by.metrics[m])}" for m, _ in axes)
            result.verdict = f"dominated by #{by.candidate.id.split('/')[-1]} on every objective ({shown})"


def select_all(resolved: ResolvedWorkflow, results: list[CandidateResult]) -> None:
    """Feasibility (engine.select.select), then, with several objectives, each target's front and choice."""
    select(resolved, results)
    if len(resolved.spec.select.objectives) < 2:
        return
    order = {r.candidate.id: i for i, r in enumerate(results)}
    for target in resolved.targets:
        mine = [r for r in results if r.candidate.target == target and r.state == "complete"]
        reference = next((r for r in mine if r.candidate.reference), None)
        choose_from_front(resolved, [r for r in mine if r.feasible], order, reference)
