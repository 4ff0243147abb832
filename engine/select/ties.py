"""Breaking a tie on the objective, only on differences that are real.

Candidates whose objective the measurements cannot separate from the best one are tied with it
(engine.select.select). Among them, in this order:

1. **The runoff** (a timing objective with a paired figure, ``select.runoff``): before the final
   selection the engine timed the best estimate against each other tied candidate again, paired
   (the objective's evaluator with the other one as its reference, interleaved in one worker:
   engine.execute.runoff). A candidate whose paired ratio's interval puts it below 1 against
   another is out: "lost the runoff".
2. **The tie-break rules** (``select.tie_break`` without ``passes``), in order, each acting only on
   a difference that is *measurable* or *material*: against the best of the candidates still in,
   on that rule, a candidate is out when
   - for a metric with samples: its interval is apart from the best's, or, both scored on the same
     samples, the paired difference excludes 0 (with ``select.confidence: null``, any difference
     of the point estimates, as the workflow asks);
   - for the model's size, or a metric measured without samples: the two values are more than
     ``select.size_margin`` (default 2%) of the larger one apart.
   Comparing with the best on the rule (never pairwise in turn) keeps the outcome independent of
   the candidates' order.
3. **The better estimate of the objective**: after a runoff, each candidate's paired ratio to the
   runoff's leader (the leader's own is 1); without one, the first measurement's estimate. A
   candidate whose paired timing with the leader lies within ``select.tie_within`` (``within``,
   engine.execute.runoff) is equivalent to it: their estimates count as equal.
4. **Fewer passes** (when ``passes`` is in ``select.tie_break``), only where those estimates are
   equal (point figures without samples, say); then the workflow's candidate order.

Stability. A fixed order of rules picks the same bytes under noise only because it looks away
from the noisy figure, and it decided on noise anyway: a fidelity point estimate inside both
intervals, a size 0.005% apart. Here, when a runoff cannot separate the leaders, its pooled paired
estimate decides, which is a noisier rule than a fixed order on a fresh host; but the runoff is an
evaluation keyed by both models' digests, the host's fingerprint and its settings, stored like any
other, so a re-run, a resumed run or a second workflow on the same store reuses it and picks the
same bytes. Where it does measure afresh and still cannot decide, the two are equally fast as far
as anything can tell, and no other figure separates them measurably or materially: either choice
is as good, and the verdict says which rule decided and on what figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.core.stats import Interval, paired_difference
from engine.select.results import CandidateResult
from engine.text.display import number


def label(result: CandidateResult) -> str:
    return f"#{result.candidate.id.split('/')[-1]}"


@dataclass(frozen=True)
class Rule:
    """A tie-break rule: ``key`` (larger is preferred), ``show`` (the value in a verdict), and
    ``apart(better, worse)``: why their difference counts (measurable or material), or None."""

    description: str
    key: Callable[[CandidateResult], float]
    show: Callable[[CandidateResult], str]
    apart: Callable[[CandidateResult, CandidateResult], str | None]


def material(margin: float, what: str = "select.size_margin") -> Callable[[float, float], str | None]:
    """``apart`` on two point values: more than ``margin`` of the larger one apart."""

    def apart(a: float, b: float) -> str | None:
        scale = max(abs(a), abs(b))
        if scale == 0 or abs(a - b) / scale <= margin:
            return None
        return f"{abs(a - b) / scale:.1%} apart, more than {what} {margin:.0%}"

    return apart


def measurable(metric: str, confidence: float | None, margin: float, seed: int) -> Callable[[CandidateResult, CandidateResult], str | None]:
    """``apart`` on a metric: paired on the same samples, else intervals, else ``margin``."""
    points = material(margin)

    def apart(a: CandidateResult, b: CandidateResult) -> str | None:
        if metric not in a.metrics or metric not in b.metrics:
            return "the other was not measured" if metric in a.metrics else None
        mine, theirs = a.samples.get(metric), b.samples.get(metric)
        if not (mine and mine.get("values")) or not (theirs and theirs.get("values")):
            return points(a.metrics[metric], b.metrics[metric])
        if confidence is None:
            return "the workflow judges point estimates" if a.metrics[metric] != b.metrics[metric] else None
        if mine.get("statistic") == theirs.get("statistic") == "mean" and len(mine["values"]) == len(theirs["values"]):
            paired = paired_difference(mine["values"], theirs["values"], confidence, seed)
            if paired.low > 0 or paired.high < 0:
                return f"the paired difference on the same samples [{number(paired.low)}, {number(paired.high)}] excludes 0"
            return None
        x, y = a.intervals.get(metric), b.intervals.get(metric)
        if x is not None and y is not None and not x.overlaps(y):
            return f"intervals apart, [{number(x.low)}, {number(x.high)}] vs [{number(y.low)}, {number(y.high)}]"
        return None

    return apart


def runoff_interval(result: CandidateResult, other: CandidateResult) -> Interval | None:
    """From ``result``'s runoff with ``other``: ``result``'s speed over ``other``'s (> 1: faster)."""
    found = result.runoffs.get(other.candidate.id)
    if not found:
        return None
    return Interval(found["estimate"], found["low"], found["high"], found.get("confidence", 0.95))


def ratio_text(interval: Interval) -> str:
    return f"{number(interval.estimate)}x [{number(interval.low)}, {number(interval.high)}]"


@dataclass
class Decision:
    """How a tie was broken: ``ranked`` (the chosen first), per loser what it lost on, and what
    chose the winner over the runner-up (``ranked[1]``)."""

    ranked: list[CandidateResult]
    lost: dict[str, str] = field(default_factory=dict)
    chosen_for: str = ""


class _Cascade:
    """The tied candidates still in, those put out (in order), and why each lost."""

    def __init__(self, tied: list[CandidateResult], order: dict[str, int]) -> None:
        self.tied, self.alive, self.order = tied, list(tied), order
        self.out: list[CandidateResult] = []
        self.lost: dict[str, str] = {}
        self.won: dict[str, str] = {}  # what put each loser out, said from the winner's side

    def drop(self, result: CandidateResult, why: str, winner_side: str) -> None:
        self.alive.remove(result)
        self.out.append(result)
        self.lost[result.candidate.id], self.won[result.candidate.id] = why, winner_side

    def runoffs(self) -> None:
        """1: out, whoever a runoff measured slower than another tied candidate."""
        for result in list(self.alive):
            for other in self.tied:
                ahead = runoff_interval(other, result)
                if result in self.alive and ahead is not None and ahead.low > 1:
                    figures = f"{label(other)} {ratio_text(ahead)} as fast as {label(result)}, paired"
                    self.drop(result, f"the runoff ({figures})", f"won the runoff: {figures}")

    def rules(self, rules: list[Rule]) -> None:
        """2: per rule, out, whoever is measurably or materially behind the best on it."""
        for rule in rules:
            best = max(self.alive, key=lambda r: (rule.key(r), -self.order[r.candidate.id]))
            for result in [r for r in self.alive if r is not best]:
                why = rule.apart(best, result)
                if why is not None:
                    text = f"{rule.description} ({label(best)} {rule.show(best)} vs {label(result)} {rule.show(result)}, {why})"
                    self.drop(result, text, f"chosen for {text}")

    def estimates(self, leader: CandidateResult, value: Callable[[CandidateResult], float], sign: int, metric: str, passes: bool) -> None:
        """3, 4: the better estimate (the runoff's paired one where every candidate left has a
        runoff with the leader), then fewer passes, then the workflow's order."""
        pooled = len(self.alive) > 1 and all(r is leader or runoff_interval(r, leader) is not None for r in self.alive)

        def within(r: CandidateResult) -> float | None:
            """The tie margin ``r``'s paired timing with the leader lies within (equivalent), or None."""
            return None if r is leader else (r.runoffs.get(leader.candidate.id) or {}).get("within")

        def score(r: CandidateResult) -> float:
            if not pooled:
                return sign * value(r)
            found = runoff_interval(r, leader)
            # equivalent within the margin: the estimate's difference is one the workflow calls immaterial
            return 1.0 if r is leader or found is None or within(r) else found.estimate

        self.alive.sort(key=lambda r: (score(r), -len(r.candidate.jobs) if passes else 0, -self.order[r.candidate.id]), reverse=True)
        winner = self.alive[0]
        for result in self.alive[1:]:
            equivalent = within(result) or within(winner)
            if score(result) != score(winner) and pooled:
                pair = runoff_interval(winner, result)
                figures = ratio_text(pair) if pair is not None else f"{number(score(winner) / score(result))}x"
                text = f"the runoff's paired estimate ({label(winner)} {figures} as fast as {label(result)}: the runoff could not separate them)"
            elif equivalent and pooled:
                pair = runoff_interval(winner, result)
                shown = f" ({label(winner)} {ratio_text(pair)} as fast as {label(result)})" if pair is not None else ""
                simpler = f"fewer passes ({len(winner.candidate.jobs)} vs {len(result.candidate.jobs)})"
                rest = (
                    simpler
                    if passes and len(result.candidate.jobs) != len(winner.candidate.jobs)
                    else "its place in the workflow's candidate order"
                )
                text = (
                    f"{rest}: equivalent on {metric}, its timing against the reference, paired, lying within the "
                    f"{number(equivalent * 100)}% tie margin{shown}, so not run off"
                )
            elif score(result) != score(winner):
                text = (
                    f"the better estimate of {metric} ({number(value(winner))} vs {number(value(result))}; "
                    "nothing else measurably or materially apart)"
                )
            elif passes and len(result.candidate.jobs) != len(winner.candidate.jobs):
                text = f"fewer passes ({len(winner.candidate.jobs)} vs {len(result.candidate.jobs)}; equal estimates of {metric})"
            else:
                text = "its place in the workflow's candidate order (nothing else separated them)"
            self.lost[result.candidate.id], self.won[result.candidate.id] = text, f"chosen for {text}"


def break_tie(
    tied: list[CandidateResult],
    leader: CandidateResult,
    rules: list[Rule],
    passes: bool,
    objective: tuple[str, int, Callable[[CandidateResult], float]],
    order: dict[str, int],
) -> Decision:
    """The cascade of the module docstring over ``tied``: ``leader`` is the best first estimate,
    ``objective`` (metric, +1 when higher is better, each candidate's first estimate of it)."""
    metric, sign, value = objective
    cascade = _Cascade(tied, order)
    cascade.runoffs()
    cascade.rules(rules)
    cascade.estimates(leader, value, sign, metric, passes)
    ranked = [*cascade.alive, *reversed(cascade.out)]
    return Decision(ranked, cascade.lost, cascade.won[ranked[1].candidate.id] if len(ranked) > 1 else "")


def runoff_json(estimate: float, low: float, high: float, confidence: float, **more: Any) -> dict[str, Any]:
    """A runoff's figures as kept on a candidate (``CandidateResult.runoffs``, by the other's id)."""
    return {"estimate": estimate, "low": low, "high": high, "confidence": confidence, **more}
