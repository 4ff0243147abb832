"""Staged evaluation: a constrained figure judged on a few rows first, on every row only when the
few cannot decide.

An evaluator that scores rows of a dataset one by one declares the option that takes the first N
of them (``Evaluator.stage_option``: perplexity's and logit_fidelity's ``limit``, fidelity's
``max_samples``) and how many the first look takes (``Evaluator.stage_rows``). When a
constraint of the workflow names one of its metrics, the workflow judges intervals
(``select.confidence``) and ``search.staged`` is on (the default), a candidate other than the
reference is measured in up to two looks:

1. on the first ``stage_rows`` rows. Each constraint on the evaluation's metrics is judged on the
   interval of those rows at the stricter confidence ``1 - (1 - c) / 2`` (``c``: the workflow's
   confidence; the error allowed is split between the two looks, Bonferroni):

   - the interval's *optimistic* bound breaks the bar (for ``max``: its lower bound is above it;
     for ``min``: its upper bound below it; for a drop: the smallest drop it allows is over the
     limit): the candidate breaks the constraint whatever the other rows hold, and that record is
     its figure;
   - every *pessimistic* bound meets its bar: the candidate meets the constraints, and that record
     is its figure;
   - otherwise (an interval straddles a bar: the candidate is near it):

2. on every row, judged exactly as without stages.

A decision taken at the first look is never looser than judging every row: it needs the interval
at the stricter confidence to clear the bar entirely, and selection later judges the recorded rows
at the workflow's own confidence, a narrower interval on the same rows, which therefore agrees.
Each look is an evaluation with its own key (the option differs), so a re-run is served both from
the store. A candidate far from the bar costs ``stage_rows`` rows instead of all of them; one near
it costs both looks (the first rows twice). The reference is staged the same way, unless a
constraint on the evaluation is relative to the reference's figure (``max_drop``,
``max_drop_ratio``): the candidates' drops are taken from it, so it is then measured on every row.
A bar on a figure the evaluator already pairs row by row with the reference (perplexity's
``nll_increase``, fidelity's cosine) needs no full-row figure of the reference: a candidate whose
second look reaches rows the reference was not measured on has them computed (and cached) then,
as every reference row is (evaluators._tokens.ReferenceRows, evaluators._refcache). On the 0.7 B
decoder the reference's perplexity on every row took 82 s, the candidates' first looks 18-30 s. A
dataset no longer than the first look is measured once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, Literal

from engine.core.artifact import ModelArtifact
from engine.core.evaluator import Evaluator
from engine.core.stats import Interval, bootstrap
from engine.plan.jobs import EvalSpec
from engine.select.results import CandidateResult
from engine.workflow.resolve import ResolvedWorkflow
from engine.workflow.schema import Constraint

logger = logging.getLogger(__name__)

#: rows the first look scores unless the evaluator says otherwise (``Evaluator.stage_rows``' default)
FIRST_ROWS = Evaluator.stage_rows
#: the bootstrap's seed (selection's: the same samples always give the same interval)
SEED = 0

Measure = Callable[[EvalSpec, ModelArtifact | None], tuple[dict[str, Any] | None, str | None]]
Side = Literal["meets", "breaks", "undecided"]


def first_look(resolved: ResolvedWorkflow, spec: EvalSpec, reference: bool) -> EvalSpec | None:
    """The evaluation on the first ``FIRST_ROWS`` rows of a candidate (``reference``: the target's
    reference, staged only where no constraint on ``spec`` is relative to its figure), or None
    where ``spec`` is measured in one look."""
    option = getattr(spec.evaluator_cls, "stage_option", None)
    if option is None or not resolved.spec.search.staged:
        return None
    constraints = _constraints(resolved, spec)
    if resolved.spec.select.confidence is None or not constraints:
        return None
    if reference and any(c.max_drop is not None or c.max_drop_ratio is not None for c in constraints):
        return None  # the candidates' drops are taken from the reference's figure: on every row
    rows = first_rows(spec)
    limit = spec.config.get(option)
    if limit is not None and limit <= rows:
        return None
    return dataclasses.replace(spec, config={**spec.config, option: rows})


def first_rows(spec: EvalSpec) -> int:
    """How many rows the first look of ``spec`` scores."""
    return int(getattr(spec.evaluator_cls, "stage_rows", FIRST_ROWS))


def measure_staged(
    resolved: ResolvedWorkflow,
    spec: EvalSpec,
    result: CandidateResult,
    reference: CandidateResult | None,
    reference_model: ModelArtifact | None,
    measure: Measure,
) -> tuple[dict[str, Any] | None, str | None]:
    """``measure(spec)``, in two looks where the rule above applies: the record the decision rests
    on (its details say which look decided), or None and why it failed."""
    first = first_look(resolved, spec, result.candidate.reference)
    if first is None:
        return measure(spec, reference_model)
    record, error = measure(first, reference_model)
    if record is None:
        return None, error  # what fails on the first rows fails on all of them
    details, rows = record.get("details") or {}, first_rows(spec)
    covered = _covered(details, rows)
    if covered is not None:
        return _noted(record, f"the first look covered every row ({covered})"), None
    side = decide(resolved, spec, record, reference)
    if side != "undecided":
        logger.debug("%s of candidate %s %s its bar on the first %d rows", spec.id, result.candidate.id, side, rows)
        return _noted(record, f"{side} the constraints on the first {rows} rows ({_strict(resolved):.1%} interval)"), None
    record, error = measure(spec, reference_model)
    if record is None:
        return None, error
    return _noted(record, f"every row: the first {rows} left the {_strict(resolved):.1%} interval across a bar"), None


def _covered(details: dict[str, Any], rows: int) -> int | None:
    """The dataset's size where the first look scored all of it (perplexity's ``rows`` below the
    look's, fidelity's ``dataset_size`` no larger than it), else None."""
    if "rows" in details and int(details["rows"]) < rows:
        return int(details["rows"])
    if "dataset_size" in details and int(details["dataset_size"]) <= rows:
        return int(details["dataset_size"])
    return None


def decide(resolved: ResolvedWorkflow, spec: EvalSpec, record: dict[str, Any], reference: CandidateResult | None) -> Side:
    """Where the first look's record stands against every constraint on ``spec``'s metrics."""
    confidence = _strict(resolved)
    ref_metrics = reference.metrics if reference is not None and reference.state == "complete" else {}
    sides: list[Side] = []
    for constraint in _constraints(resolved, spec):
        name = constraint.metric.split(".", 1)[1]
        value, sample = record.get("values", {}).get(name), (record.get("samples") or {}).get(name)
        if value is None or not sample or not sample.get("values"):
            return "undecided"  # no interval to judge: the one look the workflow asked for decides
        interval = bootstrap(sample["values"], sample.get("statistic", "mean"), confidence, SEED, sample.get("groups"))
        sides.append(side(constraint, interval, ref_metrics.get(constraint.metric)))
    if "breaks" in sides:
        return "breaks"
    return "meets" if sides and all(s == "meets" for s in sides) else "undecided"


def side(constraint: Constraint, interval: Interval, reference: float | None) -> Side:
    """``meets``: the pessimistic bound clears every bound of the constraint; ``breaks``: the
    optimistic bound breaks one; else ``undecided``."""
    meets, breaks = True, False
    if constraint.min is not None:
        meets &= interval.low >= constraint.min
        breaks |= interval.high < constraint.min
    if constraint.max is not None:
        meets &= interval.high <= constraint.max
        breaks |= interval.low > constraint.max
    if constraint.max_drop is not None or constraint.max_drop_ratio is not None:
        if reference is None:
            return "undecided"
        worst, best = reference - interval.low, reference - interval.high
        if constraint.max_drop is not None:
            meets &= worst <= constraint.max_drop
            breaks |= best > constraint.max_drop
        if constraint.max_drop_ratio is not None and reference != 0:
            meets &= worst / abs(reference) <= constraint.max_drop_ratio
            breaks |= best / abs(reference) > constraint.max_drop_ratio
    if breaks:
        return "breaks"
    return "meets" if meets else "undecided"


def _constraints(resolved: ResolvedWorkflow, spec: EvalSpec) -> list[Constraint]:
    return [c for c in resolved.spec.select.constraints if c.metric.split(".", 1)[0] == spec.id]


def _strict(resolved: ResolvedWorkflow) -> float:
    confidence = resolved.spec.select.confidence
    assert confidence is not None
    return 1 - (1 - confidence) / 2


def _noted(record: dict[str, Any], stage: str) -> dict[str, Any]:
    """The record with the look that decided in its details (a copy: the store's record is left as it is)."""
    return {**record, "details": {**(record.get("details") or {}), "stage": stage}}
