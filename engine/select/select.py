"""Selection, per target: constraints filter, the objective ranks, ties are broken by a declared
rule, the Pareto front is marked.

A choice has to survive noise. Metrics measured on samples (fidelity per sentence, accuracy per
image, speedup per timing round) get a bootstrap interval at the workflow's confidence, and:

- a constraint is judged on the pessimistic bound (a `min` on the lower bound, a `max` on the
  upper one, a drop from the reference on its upper bound, paired sample by sample when both
  models were scored on the same samples), so a model that clears a bar only by the luck of a
  small dataset is not shipped;
- a timing objective is ranked through its paired figure (latency's ``speedup``: the reference's
  time over the candidate's, measured round by round in one worker), so a busy minute does not
  decide between candidates timed minutes apart;
- candidates the measurements cannot separate from the best one are tied with it: their objective
  intervals overlap its own, or (scored on the same samples) their paired difference from it holds
  0. A candidate measurably behind the best is tied only when the workflow opts in with
  ``select.tie_within`` (a timing objective within that fraction of the best: runs minutes apart
  or under another load move a ratio by that much), and its verdict then says how far behind it
  was. The tie is broken as engine.select.ties says: first a runoff (the tied leaders of a timing
  objective timed again, paired), then ``select.tie_break``'s rules, each only on a difference
  that is measurable (intervals apart) or material (sizes more than ``select.size_margin``
  apart), then the better estimate of the objective, then fewer passes. Every complete candidate
  gets a verdict saying which rule decided, and on what figures.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.core.stats import Interval, bootstrap, paired_difference
from engine.select.results import CandidateResult
from engine.select.ties import Rule, break_tie, material, measurable
from engine.select.verdicts import Standing, write_verdicts
from engine.text.display import against, bound, number
from engine.workflow.resolve import ResolvedWorkflow
from engine.workflow.schema import Constraint, TieBreak

#: the bootstrap's seed: the same samples always give the same interval
SEED = 0


def _fmt(value: float) -> str:
    return number(value)


def _bound_text(interval: Interval | None, side: str, limit: float) -> str:
    """The interval's pessimistic bound, written so that it visibly falls on its side of ``limit``."""
    if interval is None or interval.low == interval.high:
        return ""
    edge = interval.low if side == "low" else interval.high
    return f" ({'lower' if side == 'low' else 'upper'} {interval.confidence:.0%} bound {against(edge, limit)})"


def violations(
    constraint: Constraint,
    value: float | None,
    reference: float | None,
    interval: Interval | None = None,
    drop: Interval | None = None,
) -> list[str]:
    """What ``value`` breaks of ``constraint`` (empty when it holds). With an ``interval`` the
    pessimistic bound is judged; ``drop`` is the interval of (reference - value) when the two
    were measured on the same samples."""
    name = constraint.metric
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return [f"{name} was not measured"]
    low = interval.low if interval is not None else value
    high = interval.high if interval is not None else value
    broken = []
    if constraint.min is not None and low < constraint.min:
        broken.append(
            f"{name} = {against(value, constraint.min)}{_bound_text(interval, 'low', constraint.min)} < min {bound(constraint.min)}"
        )
    if constraint.max is not None and high > constraint.max:
        broken.append(
            f"{name} = {against(value, constraint.max)}{_bound_text(interval, 'high', constraint.max)} > max {bound(constraint.max)}"
        )
    if constraint.max_drop is not None or constraint.max_drop_ratio is not None:
        if reference is None:
            broken.append(f"{name}: no reference value to measure a drop against")
        else:
            point_drop = reference - value
            worst = drop.high if drop is not None else reference - low
            worse = interval is not None and worst != point_drop
            if constraint.max_drop is not None and worst > constraint.max_drop:
                limit = constraint.max_drop
                edge = f" (upper {interval.confidence:.0%} bound {against(worst, limit)})" if interval is not None and worse else ""
                broken.append(
                    f"{name} dropped {against(point_drop, limit)}{edge} from the reference's {_fmt(reference)} (max drop {bound(limit)})"
                )
            if constraint.max_drop_ratio is not None and reference != 0 and worst / abs(reference) > constraint.max_drop_ratio:
                ratio = constraint.max_drop_ratio
                edge = (
                    f" (upper {interval.confidence:.0%} bound {against(worst / abs(reference), ratio, percent=True)})"
                    if interval is not None and worse
                    else ""
                )
                broken.append(
                    f"{name} dropped {against(point_drop / abs(reference), ratio, percent=True)}{edge} "
                    f"from the reference's {_fmt(reference)} (max {bound(ratio * 100)}%)"
                )
    return broken


def interval_of(result: CandidateResult, metric: str, confidence: float | None) -> Interval | None:
    """The metric's interval from its samples (cached on the result), or None without samples
    or when the workflow judges point estimates."""
    if confidence is None or metric not in result.metrics:
        return None
    known = result.intervals.get(metric)
    if known is not None and known.confidence == confidence:
        return known
    sample = result.samples.get(metric)
    if not sample or not sample.get("values"):
        return None
    interval = bootstrap(sample["values"], sample.get("statistic", "mean"), confidence, SEED, sample.get("groups"))
    result.intervals[metric] = interval
    return interval


def judge(resolved: ResolvedWorkflow, constraint: Constraint, result: CandidateResult, reference: CandidateResult | None) -> list[str]:
    """``violations`` of one constraint, judged on the candidate's interval at the workflow's confidence."""
    confidence = resolved.spec.select.confidence
    metric = constraint.metric
    ref_metrics = reference.metrics if reference is not None and reference.state == "complete" else {}
    drop = None
    if confidence is not None and reference is result:
        # the reference against itself: the drop is exactly 0, whatever its own uncertainty (judging
        # its lower bound against its point estimate made a reference fail a max_drop constraint)
        drop = Interval(0.0, 0.0, 0.0, confidence)
    elif confidence is not None and reference is not None:
        mine, theirs = result.samples.get(metric), reference.samples.get(metric)
        if mine and theirs and mine.get("statistic") == theirs.get("statistic") == "mean" and len(mine["values"]) == len(theirs["values"]):
            drop = paired_difference(theirs["values"], mine["values"], confidence, SEED)
    return violations(constraint, result.metrics.get(metric), ref_metrics.get(metric), interval_of(result, metric, confidence), drop)


def cheap_violations(resolved: ResolvedWorkflow, result: CandidateResult, reference: CandidateResult | None) -> list[str]:
    """Constraints already broken by the figures measured so far (the cheap ones: fidelity,
    accuracy, size), so the candidate need not be timed."""
    if result.candidate.reference:
        return []
    broken = []
    for constraint in resolved.spec.select.constraints:
        if constraint.metric in result.metrics:
            broken.extend(judge(resolved, constraint, result, reference))
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
    directions = {select.primary.metric: 1 if select.primary.goal == "max" else -1}
    for constraint in select.constraints:
        if constraint.metric in directions:
            continue
        directions[constraint.metric] = _constraint_direction(constraint)
    return directions


def _constraint_direction(constraint: Constraint) -> int:
    lower_bound = constraint.min is not None or constraint.max_drop is not None or constraint.max_drop_ratio is not None
    return 1 if lower_bound else -1


def _dominates(a: CandidateResult, b: CandidateResult, directions: dict[str, int]) -> bool:
    better = False
    for metric, sign in directions.items():
        x, y = a.metrics[metric] * sign, b.metrics[metric] * sign
        if x < y:
            return False
        better |= x > y
    return better


def paired_metric(resolved: ResolvedWorkflow, metric: str) -> str | None:
    """The paired figure its evaluator measures for ``metric`` (``latency.p50_ms`` →
    ``latency.speedup``), or None."""
    eval_id, _, name = metric.partition(".")
    entry = resolved.evaluators.get(eval_id)
    paired = entry.cls.paired_metrics.get(name) if entry is not None else None
    return f"{eval_id}.{paired}" if paired else None


def ranking_metric(resolved: ResolvedWorkflow, results: list[CandidateResult]) -> tuple[str, int]:
    """What ranks the candidates: the objective, or its paired figure when the objective's
    evaluator measured one for every candidate (latency's p50_ms → speedup). Returns the metric
    and +1 (higher is better) or -1."""
    objective = resolved.spec.select.primary
    paired = paired_metric(resolved, objective.metric)
    if paired and results and all(paired in r.metrics for r in results):
        return paired, 1
    return objective.metric, 1 if objective.goal == "max" else -1


def model_bytes(result: CandidateResult) -> int:
    """The size of the candidate's model files."""
    return 0 if result.model is None else path_bytes(Path(result.model.path))


def path_bytes(path: Path) -> int:
    """The size of a file, or of every file in a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(path) for name in names)


def _size(result: CandidateResult) -> str:
    """A model's size in MB, with its bytes where two models could round to the same MB."""
    size = model_bytes(result)
    return f"{size / 1e6:.2f} MB ({size:,} bytes)"


def metric_rule(resolved: ResolvedWorkflow, metric: str, sign: int) -> Rule:
    """Prefer the better ``metric`` (``sign`` +1: higher), on a measurable or material difference."""
    spec = resolved.spec.select
    return Rule(
        f"{'higher' if sign > 0 else 'lower'} {metric}",
        lambda r: sign * r.metrics.get(metric, -sign * math.inf),
        lambda r: _fmt(r.metrics[metric]) if metric in r.metrics else "—",
        measurable(metric, spec.confidence, spec.size_margin, SEED),
    )


def _rules(resolved: ResolvedWorkflow) -> list[Rule]:
    """The workflow's tie-break rules but ``passes`` (engine.select.ties: fewer passes only after the estimate)."""
    rules: list[Rule] = []
    spec = resolved.spec.select
    size_apart = material(spec.size_margin)
    for entry in spec.tie_break:
        if entry == "constraints":
            rules.extend(metric_rule(resolved, c.metric, _constraint_direction(c)) for c in spec.constraints)
        elif entry == "size":
            rules.append(Rule("smaller model", lambda r: -model_bytes(r), _size, lambda a, b: size_apart(model_bytes(a), model_bytes(b))))
        elif isinstance(entry, TieBreak):
            rules.append(metric_rule(resolved, entry.metric, 1 if entry.goal == "max" else -1))
    return rules


def _standing(resolved: ResolvedWorkflow, feasible: list[CandidateResult], order: dict[str, int]) -> tuple[Standing, list[CandidateResult]]:
    """The objective as judged on the first measurements: the best, every interval, and those tied with the best."""
    metric, sign = ranking_metric(resolved, feasible)
    confidence = resolved.spec.select.confidence

    def estimate(r: CandidateResult) -> Interval:
        value = r.metrics[metric]
        return interval_of(r, metric, confidence) or Interval(value, value, value, confidence or 1.0)

    intervals = {r.candidate.id: estimate(r) for r in feasible}
    # the best point estimate; the reference first among equals, then the workflow's order
    best = max(feasible, key=lambda r: (sign * intervals[r.candidate.id].estimate, r.candidate.reference, -order[r.candidate.id]))
    # an opt-in margin, for timings only (runs minutes apart or under another load move them); a
    # quality objective measured on the same samples every time is judged on its interval
    timing = is_timing(resolved, metric)
    margin = (resolved.spec.select.tie_within or 0.0) if timing else 0.0
    paired = {} if timing else _paired_differences(feasible, best, metric, confidence)
    best_value = intervals[best.candidate.id].estimate

    def indistinguishable(r: CandidateResult) -> bool:
        mine = intervals[r.candidate.id]
        if r.candidate.id in paired:  # scored on the same samples: the paired test decides
            return paired[r.candidate.id].low <= 0 <= paired[r.candidate.id].high
        return mine.estimate == best_value or (bool(confidence) and mine.overlaps(intervals[best.candidate.id]))

    def within_margin(r: CandidateResult) -> bool:
        return best_value != 0 and abs(intervals[r.candidate.id].estimate - best_value) <= margin * abs(best_value)

    by_margin = {r.candidate.id for r in feasible if not indistinguishable(r) and within_margin(r)}
    tied = [r for r in feasible if indistinguishable(r) or r.candidate.id in by_margin]
    return Standing(metric, sign, best, intervals, margin, by_margin, paired), tied


def is_timing(resolved: ResolvedWorkflow, metric: str) -> bool:
    entry = resolved.evaluators.get(metric.partition(".")[0])
    return entry is not None and bool(entry.cls.timing)


def _choose(resolved: ResolvedWorkflow, feasible: list[CandidateResult], order: dict[str, int], first: Sequence[Rule] = ()) -> None:
    """Mark the chosen candidate among ``feasible`` (one target's), with verdicts for all;
    ``first``: tie-break rules before the workflow's (the further objectives of a front)."""
    standing, tied = _standing(resolved, feasible, order)
    rules = [*first, *_rules(resolved)]
    passes = "passes" in resolved.spec.select.tie_break
    decision = break_tie(
        tied, standing.best, rules, passes, (standing.metric, int(standing.sign), lambda r: standing.interval(r).estimate), order
    )
    ranked = decision.ranked
    ranked[0].chosen = True
    ranked[0].tied_with = [r.candidate.id for r in ranked[1:]]
    write_verdicts(feasible, ranked, standing, decision)


def runoff_pairs(resolved: ResolvedWorkflow, results: list[CandidateResult]) -> list[tuple[CandidateResult, CandidateResult]]:
    """The runoffs a final selection wants, per target (engine.execute.runoff runs them): the best
    first estimate against each candidate tied with it (within noise, or by ``select.tie_within``),
    where the objective is a single timing one ranked by its paired figure and the workflow keeps
    the runoff on. Feasibility is judged as ``select`` judges it."""
    spec = resolved.spec.select
    if spec.runoff_budget is None or len(spec.objectives) > 1:
        return []
    order = {r.candidate.id: i for i, r in enumerate(results)}
    pairs = []
    for target in resolved.targets:
        mine = [r for r in results if r.candidate.target == target]
        reference = next((r for r in mine if r.candidate.reference and r.state == "complete"), None)
        feasible = []
        for result in (r for r in mine if r.state == "complete" and spec.primary.metric in r.metrics):
            broken = result.violations if result.untimed else [b for c in spec.constraints for b in judge(resolved, c, result, reference)]
            if not broken:
                feasible.append(result)
        if len(feasible) < 2:
            continue
        metric, _ = ranking_metric(resolved, feasible)
        if not is_timing(resolved, metric) or metric != paired_metric(resolved, spec.primary.metric):  # no paired figure to run off on
            continue
        standing, tied = _standing(resolved, feasible, order)
        pairs += [(standing.best, r) for r in tied if r is not standing.best]
    return pairs


def _paired_differences(
    feasible: list[CandidateResult], best: CandidateResult, metric: str, confidence: float | None
) -> dict[str, Interval]:
    """Per candidate scored on the same samples as ``best`` (means over samples of equal count),
    the interval of best - candidate; a candidate whose interval holds 0 cannot be told from the best."""
    theirs = best.samples.get(metric)
    if not confidence or not theirs or theirs.get("statistic") != "mean":
        return {}
    found = {}
    for r in feasible:
        mine = r.samples.get(metric)
        if r is not best and mine and mine.get("statistic") == "mean" and len(mine["values"]) == len(theirs["values"]):
            found[r.candidate.id] = paired_difference(theirs["values"], mine["values"], confidence, SEED)
    return found


def select(resolved: ResolvedWorkflow, results: list[CandidateResult]) -> None:
    """Mark feasibility, the chosen candidate and the Pareto front of each target, in place
    (with several objectives, only feasibility: engine.select.front.select_all does the rest)."""
    spec = resolved.spec.select
    directions = _directions(resolved)
    order = {r.candidate.id: i for i, r in enumerate(results)}
    for target in resolved.targets:
        mine = [r for r in results if r.candidate.target == target]
        reference = next((r for r in mine if r.candidate.reference and r.state == "complete"), None)
        complete = [r for r in mine if r.state == "complete"]
        for result in complete:
            for metric in result.samples:
                interval_of(result, metric, spec.confidence)
            if not result.untimed:  # an untimed candidate keeps the violations that stopped it
                result.violations = [broken for constraint in spec.constraints for broken in judge(resolved, constraint, result, reference)]
            result.feasible = not result.violations
        feasible = [r for r in complete if r.feasible and spec.primary.metric in r.metrics]
        if len(spec.objectives) > 1:
            continue  # the front and the choice: engine.select.front
        if feasible:
            _choose(resolved, feasible, order)
        measured = [r for r in complete if all(m in r.metrics for m in directions)]
        for result in measured:
            result.pareto = not any(_dominates(other, result, directions) for other in measured if other is not result)


def intervals_json(result: CandidateResult) -> dict[str, Any]:
    return {metric: interval.to_json() for metric, interval in sorted(result.intervals.items())}


def under_load(result: CandidateResult) -> dict[str, Any]:
    """The timing evaluations of ``result`` that kept rounds taken while other processes kept
    the machine busy: {evaluation id: its noise figures}."""
    out = {}
    for eval_id, details in result.details.items():
        noise = details.get("noise") if isinstance(details, dict) else None
        if isinstance(noise, dict) and noise.get("loaded"):
            out[eval_id] = {**noise, "interval_half_width": details.get("interval_half_width")}
    return out
