"""The runoff: before the final selection, the candidates tied on a timing objective are timed
again, paired, so that a tie is broken by a measurement where one can decide it.

engine.select.select.runoff_pairs names the pairs (per target: the best first estimate and each
candidate tied with it). Each pair is one evaluation job: the objective's evaluator (latency,
throughput, generation: they time a candidate against a reference in interleaved rounds in one
worker, so drift hits both alike) with the first model as the candidate and the other as its
reference, its stopping rule set by ``select.runoff`` (``max_time_s``: the budget; ``precision``:
stop once the paired ratio's interval is within that fraction, so a larger difference is
decided), and stopped as soon as the interval lies wholly on one side of 1 (the evaluators'
``stop_when_slower`` and ``stop_when_faster_than: 1``): the runoff's question is decided then. The job is keyed like every evaluation: both models' digests, the target's fingerprint
with the host's, the settings, so a re-run or a resumed run reuses it (and so chooses the same
bytes), and its record sits in the store beside the others. What it measured is kept on both
candidates (``CandidateResult.runoffs``, in candidates.json) and engine.select.ties reads it.

A pair whose candidate runs with searched session settings is not run off (the reference side
would run on the target as written, not as that candidate ran): its tie goes to the rules. Nor is a
pair of one model made by two paths (the same digest: NNCF's accuracy control that reverted
nothing writes the plain quantization's bytes); its figures are shared, and the rules decide.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from engine.core.stats import bootstrap
from engine.execute.evaluation import FASTER_OPTION
from engine.execute.runner import Runner
from engine.plan.jobs import EvalSpec
from engine.select.results import CandidateResult
from engine.select.select import interval_of, paired_metric, runoff_pairs
from engine.select.ties import runoff_json

log = logging.getLogger(__name__)

#: the evaluator options a runoff sets (engine.core's ComparisonRules, shared by the timing evaluators that compare)
BUDGET_OPTIONS = ("max_time_s", "precision")


def run_runoffs(runner: Runner) -> int:
    """Run the runoffs the current results call for (store first); returns how many pairs were measured."""
    resolved = runner.resolved
    budget = resolved.spec.select.runoff_budget
    plan_order = {c.id: i for i, c in enumerate(runner.plan.candidates)}  # the order the final selection sees
    results = sorted(runner.results.values(), key=lambda r: plan_order.get(r.candidate.id, len(plan_order)))
    pairs = runoff_pairs(resolved, results)
    if budget is None or not pairs:
        return 0
    # the paired figure itself (latency.speedup), never the ranking metric of all results, which falls
    # back to the objective (p50_ms) when a failed or untimed candidate lacks the paired figure
    metric = paired_metric(resolved, resolved.spec.select.primary.metric)
    if metric is None:
        return 0
    eval_id, _, name = metric.partition(".")
    spec = next((s for s in runner.evaluations if s.id == eval_id), None)
    if spec is None or not all(option in spec.evaluator_cls.Config.model_fields for option in BUDGET_OPTIONS):
        log.info("no runoff: evaluation %s has no %s to set", eval_id, " or ".join(BUDGET_OPTIONS))
        return 0
    config = {**spec.config, "max_time_s": budget.max_time_s, "precision": budget.precision}
    if FASTER_OPTION in spec.evaluator_cls.Config.model_fields:
        config[FASTER_OPTION] = 1.0  # decided once either model is faster beyond doubt (stop_when_slower: the other side)
    runoff = dataclasses.replace(spec, config=config)
    settled = _settled_by_the_reference(runner, metric, eval_id, pairs)
    measured = 0
    for first, second in pairs:
        if first.candidate.settings or second.candidate.settings:
            continue
        if second.candidate.id in first.runoffs or {first.candidate.id, second.candidate.id} & settled:
            continue
        if first.model is not None and second.model is not None and first.model.digest == second.model.digest:
            continue  # one model made by two paths: the same figures, nothing to run off; the rules decide (fewer passes)
        if _measure(runner, runoff, name, first, second):
            measured += 1
    return measured


def _settled_by_the_reference(runner: Runner, metric: str, eval_id: str, pairs: list[tuple[CandidateResult, CandidateResult]]) -> set[str]:
    """The ids of the tied candidates whose own timing already was a runoff against a tied reference: it timed
    them against their target's reference, paired, and its interval lies wholly on one side of 1.
    That measurement is kept as their runoff with the reference (``from: "its timing"``); one
    measured slower than the reference cannot be chosen (engine.select.ties puts it out), so no
    runoff is spent on it.

    An interval that holds 1 decides nothing by itself, and that pair is run off, unless it lies
    wholly within the workflow's practical margin (``select.tie_within``: between 1 / (1 + margin)
    and 1 + margin): then the two are equivalent at the workflow's confidence, and a runoff could
    only resolve a difference the workflow has called immaterial. That timing is kept as their
    runoff (``within``: the margin), and the rules after the runoff decide, counting the two
    estimates as equal (engine.select.ties: fewer passes, then the workflow's order). On bert-openvino the FP32 IR at the device's precision against the FP32 reference
    on an AVX2 host, 0.984x [0.958, 1.018] within a margin of 10%, took a 32 s runoff that could
    not separate them."""
    tied = {r.candidate.id: r for pair in pairs for r in pair}
    settled: set[str] = set()
    select = runner.resolved.spec.select
    margin = select.tie_within or 0.0
    for result in tied.values():
        reference = runner.references.get(result.candidate.target)
        if reference is None or result is reference or reference.candidate.id not in tied or result.candidate.settings:
            continue
        interval = interval_of(result, metric, select.confidence)
        if interval is None:
            continue
        holds_one = interval.low <= 1 <= interval.high
        equivalent = interval.within_ratio(margin)
        if holds_one and not equivalent:
            continue
        if reference.candidate.id not in result.runoffs:
            shared = {"metric": metric, "key": result.eval_keys.get(eval_id), "status": "hit", "from": "its timing"}
            if holds_one:
                shared["within"] = margin
            _keep(result, reference, (interval.estimate, interval.low, interval.high, interval.confidence), shared)
        if interval.high < 1:
            settled.add(result.candidate.id)
    return settled


def _measure(runner: Runner, spec: EvalSpec, name: str, first: CandidateResult, second: CandidateResult) -> bool:
    fetched, key = runner.measure_pair(spec, first, second)
    if fetched.status == "failed":
        log.warning(
            "the runoff of %s against %s failed (its tie goes to the rules): %s", first.candidate.id, second.candidate.id, fetched.error
        )
        return False
    figures = _interval(fetched.record, name, runner.resolved.spec.select.confidence, float(spec.config.get("confidence", 0.95)))
    if figures is None:
        log.warning("the runoff of %s against %s measured no %s", first.candidate.id, second.candidate.id, name)
        return False
    values = fetched.record.get("values") or {}
    shared = {"metric": f"{spec.id}.{name}", "key": key, "status": fetched.status, "rounds": values.get("rounds")}
    _keep(first, second, figures, shared)
    return True


def _keep(first: CandidateResult, second: CandidateResult, figures: tuple[float, float, float, float], shared: dict[str, Any]) -> None:
    """A paired comparison kept on both candidates: ``first``'s speed over ``second``'s (estimate,
    low, high, confidence) on ``first``, its inverse on ``second``."""
    estimate, low, high, confidence = figures
    first.runoffs[second.candidate.id] = runoff_json(estimate, low, high, confidence, **shared)
    second.runoffs[first.candidate.id] = runoff_json(1 / estimate, 1 / high, 1 / low, confidence, **shared, inverted=True)


def _interval(record: dict[str, Any], name: str, confidence: float | None, own: float) -> tuple[float, float, float, float] | None:
    """The paired ratio's estimate and interval: the evaluator's own bounds (``<name>_low`` /
    ``_high``, at its own confidence ``own``), else bootstrapped from its samples at the workflow's."""
    values, samples = record.get("values") or {}, (record.get("samples") or {}).get(name)
    if name not in values or values[name] <= 0:
        return None
    if f"{name}_low" in values and f"{name}_high" in values and values[f"{name}_low"] > 0:
        return values[name], values[f"{name}_low"], values[f"{name}_high"], own
    if samples and samples.get("values") and confidence is not None:
        interval = bootstrap(samples["values"], samples.get("statistic", "median"), confidence, 0, samples.get("groups"))
        if interval.low > 0:
            return interval.estimate, interval.low, interval.high, confidence
    return values[name], values[name], values[name], confidence or 0.95
