"""The evaluation policy: which of the workflow's evaluations a candidate gets, in what order,
and when measuring it stops early. Measuring one evaluation is the runner's business."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from engine import registry
from engine.core.artifact import ModelArtifact
from engine.core.errors import inapplicable_reason
from engine.execute.datasets import Datasets
from engine.execute.stages import measure_staged
from engine.plan.jobs import EvalSpec
from engine.select.results import CandidateResult, CandidateState
from engine.select.select import cheap_violations, paired_metric
from engine.workflow.resolve import ResolvedWorkflow

#: measure one evaluation of the candidate (against the reference model, when it has one): its
#: record, or None and why it failed
Measure = Callable[[EvalSpec, ModelArtifact | None], tuple[dict[str, Any] | None, str | None]]


#: the evaluation the engine adds where no evaluation of the workflow opens a session (evaluators.load)
LOAD = "load"
#: the option of the timing evaluators (their ComparisonRules) that ends a comparison once the candidate is faster beyond doubt
FASTER_OPTION = "stop_when_faster_than"
#: the evaluators' option that ends a comparison found equivalent within a margin (ComparisonRules)
WITHIN_OPTION = "stop_when_within"


def candidate_evaluations(resolved: ResolvedWorkflow) -> list[EvalSpec]:
    """Cheap figures first; evaluations kept for passes (``candidates: false``) are left out.
    Where none of them opens the model on the target (size alone), the engine's ``load`` comes
    last: a candidate its target cannot open fails there and is never chosen. The objective's
    timing is measured to its decision (``to_the_decision``)."""
    specs = sorted((EvalSpec.of(e) for e in resolved.evaluators.values() if e.candidates), key=lambda spec: spec.timing)
    specs = [to_the_decision(resolved, spec) for spec in specs]
    if specs and not any(spec.evaluator_cls.opens_session for spec in specs):
        cls = registry.load("evaluators", LOAD)
        name = LOAD if LOAD not in resolved.evaluators else f"{LOAD}_check"
        specs.append(EvalSpec(id=name, plugin=LOAD, evaluator_cls=cls, config={}, timeout_s=cls.default_timeout_s))
    return specs


def to_the_decision(resolved: ResolvedWorkflow, spec: EvalSpec) -> EvalSpec:
    """The timing the objective ranks on (its paired figure, ``latency.speedup``), measured
    until it decides what the first measurement has to decide, where the selection runs ties off.

    Measured against its target's reference, a candidate answers one question: is it faster than
    the reference by more than the practical margin (``select.tie_within``; without one, faster
    at all)? Once the whole interval of its speedup lies above 1 + that margin, more rounds
    only narrow the interval, for a ranking among the faster candidates that the runoff settles
    better: it times the tied leaders against each other, paired, without the reference's arm
    (on the 0.7 B decoder an FP32 reference decoding at 6 tokens/s, most of each round). So the
    option ``stop_when_faster_than`` (the evaluators' ComparisonRules) is set to 1 + margin, as
    ``stop_when_slower`` already ends a candidate that is slower beyond doubt; with
    ``select.tie_within`` set, ``stop_when_within`` too, to that margin: a candidate whose whole
    interval lies within it of 1 is equivalent to its reference (engine.execute.runoff does not
    run that pair off, and engine.select.ties counts their estimates as equal), so more rounds
    could only resolve a difference the workflow calls immaterial (on bert-openvino the FP32 IR
    at the device's precision, as fast as the FP32 reference, was timed for 22 rounds to the 30 s
    budget, to 0.975x [0.948, 1.080], inside 10%). The evaluator's minimums
    (``sessions``, ``min_rounds``, ``runs``) still hold. Left as written: a workflow
    without the runoff (the first measurement is all the ranking has), several objectives, a
    constraint on one of the evaluation's figures (its bar is the decision: the interval must
    settle it), an evaluator without the option, and a workflow that sets the option itself.
    A measurement of the evaluation as written (the same run without the runoff) asks more, so
    it answers this one too: the store is asked for it first (``EvalSpec.as_written``)."""
    select = resolved.spec.select
    if select.runoff_budget is None or len(select.objectives) > 1 or spec.config.get(FASTER_OPTION) is not None:
        return spec
    paired = paired_metric(resolved, select.primary.metric)
    if paired is None or paired.partition(".")[0] != spec.id or FASTER_OPTION not in spec.evaluator_cls.Config.model_fields:
        return spec
    if any(c.metric.partition(".")[0] == spec.id for c in select.constraints):
        return spec
    config = {**spec.config, FASTER_OPTION: 1.0 + (select.tie_within or 0.0)}
    if select.tie_within and WITHIN_OPTION in spec.evaluator_cls.Config.model_fields and spec.config.get(WITHIN_OPTION) is None:
        config[WITHIN_OPTION] = select.tie_within  # equivalent to the reference: the runoff skips it, the estimates count as equal
    return dataclasses.replace(spec, config=config, as_written=spec)


def evaluate(
    resolved: ResolvedWorkflow,
    specs: list[EvalSpec],
    result: CandidateResult,
    reference: CandidateResult | None,  # the target's reference candidate
    datasets: Datasets,
    measure: Measure,
    reference_model: ModelArtifact | None = None,  # the reference's model, made but not measured (search.reference: false)
) -> None:
    """Measure ``result``'s model with ``specs`` in order. Once a figure breaks a constraint the
    candidate cannot be chosen, so what is left is not measured: not timed, nor judged on another
    dataset (unless the search times infeasible candidates too); a constrained figure scored row by
    row is judged on a few rows first (engine.execute.stages); the first evaluation that cannot
    run or fails ends the candidate as failed."""
    if result.candidate.reference:
        reference_model = None
    elif reference is not None and reference.state == "complete":
        reference_model = reference.model
    for index, spec in enumerate(specs):
        if index and not resolved.spec.search.time_infeasible:
            broken = cheap_violations(resolved, result, reference)
            if broken:
                result.untimed, result.violations = True, broken
                break
        why = _cannot_run(spec, result, reference_model, datasets)
        if why is None:
            record, error = measure_staged(resolved, spec, result, reference, reference_model, measure)
            why = None if record is not None else f"evaluation {spec.id} failed: {error}"
        if why is not None:
            inapplicable = inapplicable_reason(why)
            if inapplicable is not None:  # a setting the model cannot take: known when the session opened, nothing measured
                result.state, result.reason = CandidateState.INAPPLICABLE, inapplicable
                return
            result.state, result.reason = CandidateState.FAILED, why
            return
        assert record is not None
        result.metrics.update({f"{spec.id}.{name}": value for name, value in record["values"].items()})
        result.samples.update({f"{spec.id}.{name}": sample for name, sample in (record.get("samples") or {}).items()})
        result.details[spec.id] = record.get("details") or {}
    result.state = CandidateState.COMPLETE


def _cannot_run(spec: EvalSpec, result: CandidateResult, reference: ModelArtifact | None, datasets: Datasets) -> str | None:
    if spec.needs_reference and reference is None and not result.candidate.reference:
        return f"{spec.id} needs the reference model of {result.candidate.target}, which failed"
    return datasets.unreadable(spec.datasets)
