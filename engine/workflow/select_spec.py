"""The workflow file's ``select`` part: objectives, constraints, how ties are broken (engine.select
reads it)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from engine.workflow.strict import MAX_SECONDS
from engine.workflow.strict import Strict as _Strict


class Objective(_Strict):
    metric: str = Field(description="<evaluate id>.<metric>, e.g. latency.p50_ms.")
    goal: Literal["min", "max"] = Field(default="min", description="Minimize or maximize the metric.")


class Constraint(_Strict):
    """A bound a candidate must meet. Drops are measured against the reference (the unoptimized
    model on the same target)."""

    metric: str = Field(description="<evaluate id>.<metric>, e.g. fidelity.cosine_mean.")
    min: float | None = Field(default=None, description="The metric must be at least this.")
    max: float | None = Field(default=None, description="The metric must be at most this.")
    max_drop: float | None = Field(default=None, ge=0, description="At most this much below the reference's value (absolute).")
    max_drop_ratio: float | None = Field(default=None, ge=0, description="At most this fraction below the reference's value (0.01 = 1%).")

    @model_validator(mode="after")
    def _some_bound(self) -> Constraint:
        if all(getattr(self, name) is None for name in ("min", "max", "max_drop", "max_drop_ratio")):
            raise ValueError("a constraint needs at least one of min, max, max_drop, max_drop_ratio")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min:g} is above max {self.max:g}: no value can meet both")
        return self


class TieBreak(_Strict):
    """Prefer, among tied candidates, the better value of a metric."""

    metric: str = Field(description="<evaluate id>.<metric>, e.g. size.bytes.")
    goal: Literal["min", "max"] = Field(description="Prefer the lower (min) or the higher (max) value.")


TIE_BREAK_RULES = ("constraints", "size", "passes")


class Runoff(_Strict):
    """The budget of a runoff: the tied leaders of a timing objective timed again, paired (the
    objective's evaluator with one of them as the other's reference, interleaved in one worker)."""

    max_time_s: float = Field(
        default=30.0,
        gt=0,
        le=MAX_SECONDS,
        description="Seconds of measurement per pair at most (the evaluator's max_time_s for the runoff).",
    )
    precision: float = Field(
        default=0.02,
        gt=0,
        lt=1,
        description=(
            "Stop measuring a pair once the interval of its paired ratio is within this fraction of it (0.02: ±2%): "
            "a difference larger than that is then decided."
        ),
    )


def _runoff_switch(value: Any) -> Any:
    """``select.runoff``: true is the default budget, false none; a mapping sets the budget."""
    if value is True:
        return {}
    if value is False:
        return None
    if value is None or isinstance(value, (dict, Runoff)):
        return value
    raise ValueError(f"write true, false or {{max_time_s: <seconds>, precision: <fraction>}}, not {value!r}")


class Weights(_Strict):
    """Choose from the Pareto front the candidate with the lowest weighted sum of its objectives,
    each as the log of its ratio to the reference's value (turned round for a `max` goal), so
    twice as fast and half the size weigh the same."""

    weights: list[float] = Field(min_length=2, description="One weight (>= 0) per objective, in order.")

    @model_validator(mode="after")
    def _non_negative(self) -> Weights:
        if any(w < 0 for w in self.weights) or not any(w > 0 for w in self.weights):
            raise ValueError("weights must be >= 0, and one of them > 0")
        return self


class SelectSpec(_Strict):
    objective: Objective | list[Objective] = Field(
        description=(
            "What to optimize: one {metric, goal}, or a list of them for a multi-objective search, whose result is the "
            "Pareto front of the feasible candidates; `choose` says which model of the front is the answer."
        )
    )
    choose: Literal["first"] | Weights = Field(
        default="first",
        description=(
            "With several objectives, how one model is chosen from the Pareto front: `first` (the best on the first "
            "objective, ties broken by the next objectives, then `tie_break`), or {weights: [...]} (the lowest weighted "
            "sum of log ratios to the reference)."
        ),
    )
    constraints: list[Constraint] = Field(default_factory=list)
    confidence: float | None = Field(
        default=0.95,
        gt=0,
        lt=1,
        description=(
            "Judge constraints on this confidence bound of each metric that comes with samples (fidelity, accuracy, speedup): "
            "a `min` on the lower bound, a `max` on the upper bound, a drop on its upper bound. Candidates whose objective "
            "intervals overlap are tied. null: judge point estimates and never tie."
        ),
    )
    tie_within: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description=(
            "Opt-in, for a timing objective: candidates within this fraction of the best one are tied with it too, even when "
            "their intervals do not overlap (0.1: within 10%), so a measurably slower model can win the tie-break; its "
            "verdict says it was measurably slower and by how much. Runs minutes apart, or under another load, move a speedup "
            "by more than one run's interval. A candidate whose paired timing against its target's reference lies wholly "
            "within this margin is equivalent to it: that pair is not run off (`runoff`), and their estimates count as equal (fewer passes decides). "
            "null or 0 (the default): ties only where the intervals overlap (or a paired difference on the same samples holds 0)."
        ),
    )
    tie_break: list[Literal["constraints", "size", "passes"] | TieBreak] = Field(
        default_factory=lambda: list(TIE_BREAK_RULES),
        description=(
            "How a tie on the objective is broken after the runoff, rule by rule, each acting only on a difference that is "
            "measurable (intervals apart, or a paired difference on the same samples excluding 0) or material (more than "
            "`size_margin` apart): `constraints` (each constraint's metric in order, e.g. the higher fidelity), `size` (the "
            "smaller model), or {metric, goal}. Then the better estimate of the objective decides; `passes` (fewer passes) "
            "only where those estimates are equal; then the workflow's candidate order."
        ),
    )

    runoff: Annotated[Runoff | None, BeforeValidator(_runoff_switch)] = Field(
        default_factory=Runoff,
        json_schema_extra=lambda schema: schema.setdefault("anyOf", []).insert(0, {"type": "boolean"}),  # type: ignore[union-attr]
        description=(
            "Before any tie-break rule, the candidates tied on a timing objective are timed again, paired with the best "
            "estimate (interleaved in one worker, cached by both models' digests, the host and these settings); one whose "
            "paired ratio's interval excludes 1 wins or loses the runoff. true (the default): {max_time_s: 30, "
            "precision: 0.02}; false: no runoff."
        ),
    )
    size_margin: float = Field(
        default=0.02,
        ge=0,
        lt=1,
        description=(
            "A tie-break on size, or on a metric measured without samples, acts only on a difference larger than this "
            "fraction of the larger value (0.02: 2%); smaller differences are no difference."
        ),
    )

    @property
    def runoff_budget(self) -> Runoff | None:
        """The runoff's settings, or None when the workflow turns it off."""
        return self.runoff

    @property
    def objectives(self) -> list[Objective]:
        """The objectives, in order (one for a single-objective search)."""
        return list(self.objective) if isinstance(self.objective, list) else [self.objective]

    @property
    def primary(self) -> Objective:
        """The first objective: what ranks the candidates (of the Pareto front, with several)."""
        return self.objectives[0]

    @model_validator(mode="after")
    def _objectives(self) -> SelectSpec:
        if isinstance(self.objective, list):
            if not self.objective:
                raise ValueError("`objective` lists no objective: give one {metric, goal} or several")
            metrics = [o.metric for o in self.objective]
            if len(set(metrics)) != len(metrics):
                raise ValueError(f"`objective` names a metric twice: {metrics}")
        if isinstance(self.choose, Weights) and len(self.choose.weights) != len(self.objectives):
            raise ValueError(
                f"`choose.weights` has {len(self.choose.weights)} weights for {len(self.objectives)} objectives: give one per objective"
            )
        return self
