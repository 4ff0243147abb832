"""Why each feasible candidate of a target won or lost, written into its ``verdict``.

A tie is what the measurements cannot separate: objective intervals that overlap the best one's
(or, where both were scored on the same samples, a paired difference whose interval holds 0).
``select.tie_within`` widens a timing tie to candidates measurably behind the best; a candidate
chosen only through that margin says so, with how far behind it was. Which rule broke a tie, and
on what figures, is engine.select.ties's ``Decision``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.stats import Interval
from engine.select.results import CandidateResult
from engine.select.ties import Decision, label
from engine.text.display import against, number


def describe(result: CandidateResult | None, metric: str, interval: Interval, other: float | None = None) -> str:
    """``#3 latency.speedup 1.52 [1.47, 1.58]`` (without the candidate's number when ``result`` is None);
    given ``other`` (the figure it is compared with), the estimate has the digits that tell them apart."""
    estimate = number(interval.estimate) if other is None or other == interval.estimate else against(interval.estimate, other)
    figure = f"{metric} {estimate}"
    if interval.low != interval.high:
        figure += f" [{number(interval.low)}, {number(interval.high)}]"
    return figure if result is None else f"{label(result)} {figure}"


@dataclass
class Standing:
    """The objective as the selection judged it: the best candidate, every feasible one's interval,
    and those tied with the best only through ``select.tie_within`` (measurably behind it)."""

    metric: str
    sign: float
    best: CandidateResult
    intervals: dict[str, Interval]
    margin: float
    by_margin: set[str]
    #: the paired difference (best - candidate) where both were scored on the same samples
    paired: dict[str, Interval] = field(default_factory=dict)

    def interval(self, result: CandidateResult) -> Interval:
        return self.intervals[result.candidate.id]

    @property
    def worse(self) -> str:
        return "slower" if self.metric.endswith("speedup") or self.metric.endswith("_ms") else "worse"

    def behind(self, result: CandidateResult) -> float:
        """How far ``result``'s estimate is behind the best one's, as a fraction of the best."""
        best = self.interval(self.best).estimate
        return 0.0 if best == 0 else self.sign * (best - self.interval(result).estimate) / abs(best)

    def gap(self, result: CandidateResult) -> str:
        """``measurably slower than the best #1 (…): 7.1% behind``, for a candidate tied by the margin only."""
        best, mine = self.interval(self.best), self.interval(result)
        how = "its interval clear of the best's" if mine.low != mine.high or best.low != best.high else "on the point estimates"
        return (
            f"measurably {self.worse} than the best {label(self.best)} ({describe(result, self.metric, mine, best.estimate)} "
            f"vs {describe(None, self.metric, best, mine.estimate)}: {self.behind(result):.1%} behind, {how})"
        )

    @property
    def allowance(self) -> str:
        return f"select.tie_within {self.margin:.0%}"


def write_verdicts(feasible: list[CandidateResult], ranked: list[CandidateResult], standing: Standing, decision: Decision) -> None:
    """Why the chosen one (``ranked[0]``; ``ranked`` are those tied with the best) won, and why
    every other feasible candidate lost (``decision``: engine.select.ties)."""
    chosen, metric, margined = ranked[0], standing.metric, standing.by_margin
    mine = standing.interval(chosen)
    if len(feasible) == 1:
        chosen.verdict = "the only candidate that met the constraints"
    elif len(ranked) == 1:
        runner_up = max((r for r in feasible if r is not chosen), key=lambda r: standing.sign * standing.interval(r).estimate)
        second = standing.interval(runner_up)
        chosen.verdict = (
            f"best {describe(None, metric, mine, second.estimate)}, clear of the next best "
            f"({describe(runner_up, metric, second, mine.estimate)})"
        )
    elif chosen.candidate.id in margined:
        chosen.verdict = (
            f"{standing.gap(chosen)}; tied with it only by {standing.allowance}, which the workflow sets; {decision.chosen_for}"
        )
    else:
        others = ", ".join(describe(r, metric, standing.interval(r)) for r in ranked[1:])
        within = f"within noise or {standing.allowance}" if any(r.candidate.id in margined for r in ranked[1:]) else "within noise"
        chosen.verdict = f"tied {within} ({describe(chosen, metric, mine)}) with {others}; {decision.chosen_for}"
    for result in feasible:
        if result is not chosen:
            result.verdict = _loser(result, chosen, ranked, standing, decision)


def _loser(result: CandidateResult, chosen: CandidateResult, tied: list[CandidateResult], standing: Standing, decision: Decision) -> str:
    margined, best = standing.by_margin, standing.best
    lost = decision.lost.get(result.candidate.id, "")
    if result is best and chosen.candidate.id in margined:
        return (
            f"the best on {standing.metric}, {standing.behind(chosen):.1%} ahead of the chosen {label(chosen)}, which "
            f"{standing.allowance} let tie with it; lost on {lost}"
        )
    if result in tied:
        if result.candidate.id in margined:
            return f"tied with the chosen {label(chosen)} only by {standing.allowance} ({standing.gap(result)}); lost on {lost}"
        return f"tied with the chosen {label(chosen)} (within noise); lost on {lost}"
    anchor = standing.interval(best)
    theirs = standing.interval(result)
    which = "the chosen" if best is chosen else "the best"
    paired = standing.paired.get(result.candidate.id)
    apart = (
        f"the paired difference on the same samples {describe(None, 'difference', paired)} excludes 0"
        if paired is not None
        else "outside its interval"
    )
    return (
        f"{standing.worse} than {which} {label(best)} ({standing.metric} {against(anchor.estimate, theirs.estimate)}): "
        f"{describe(result, standing.metric, theirs, anchor.estimate)}, {apart}"
        + (f" and more than {standing.allowance} behind" if standing.margin else "")
    )
