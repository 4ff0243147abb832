"""Latency: the time of one inference, measured as a comparison with the reference model.

A candidate's milliseconds alone say little on a shared machine: a busy neighbour doubles them,
and candidates timed minutes apart meet different neighbours. So the candidate and its target's
reference are opened side by side in this worker and timed in interleaved rounds (reference then
candidate, then candidate then reference, ...), and what is reported first is the **speedup**: the
reference's median time over the candidate's, round by round, with a bootstrap confidence interval.
Drift hits both models alike and cancels out of the ratio. The rounds are spread over several fresh
pairs of sessions, because each opening lays memory and threads out anew and moves the ratio by a
few percent; the interval is bootstrapped over sessions, then rounds (a clustered bootstrap), so it
covers what another opening, or a re-run, would see. Blocks of rounds are added until the interval
is as tight as ``precision`` asks or ``max_time_s`` is spent.

While timing, the machine is watched (CPU used by other processes, time stolen by the
hypervisor): a round taken while others used more than ``busy_cores`` is thrown away and taken
again once the machine is quiet; when it never gets quiet, the rounds are kept and the result
says it was measured under load and how wide its interval is.

The usual figures (mean, percentiles, throughput of the candidate) are still reported, from all
of the candidate's timed runs. The reference itself is timed the same way, alone (speedup 1).

numpy is imported inside functions: the engine imports this module at validate time to read
``Config``, and ``engine --help`` must stay fast.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from engine.core.evaluator import EvalContext, Evaluator, MetricResult, Samples
from engine.core.stats import Interval, bootstrap
from evaluators._noise import Load, NoiseMeter
from evaluators._sessions import FeedConfig, dataset_batch, feeds_for, open_session, run_session

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact
    from engine.core.target import Session

logger = logging.getLogger(__name__)
#: the shortest stretch whose load is judged on its own (the kernel's CPU counters tick every 10 ms)
LOAD_WINDOW_S = 0.1


class Latency(Evaluator):
    name = "latency"
    summary = (
        "Time per inference as a comparison: the candidate and its target's reference timed in interleaved rounds, "
        "giving the speedup with a confidence interval, plus the candidate's percentiles, throughput and load time; "
        "rounds taken while other processes keep the machine busy are re-measured and flagged."
    )
    version = "2"
    timing = True
    needs_reference = True
    metrics = (
        "mean_ms",
        "p50_ms",
        "p90_ms",
        "p95_ms",
        "p99_ms",
        "std_ms",
        "min_ms",
        "max_ms",
        "throughput_per_s",
        "load_ms",
        "speedup",
        "speedup_low",
        "speedup_high",
        "reference_p50_ms",
        "rounds",
        "others_cores",
    )
    paired_metrics = {"p50_ms": "speedup", "mean_ms": "speedup", "throughput_per_s": "speedup"}

    class Config(FeedConfig):
        warmup: int = Field(
            default=10,
            ge=0,
            le=100_000,
            description="Untimed runs of each model before measuring (caches, allocator, lazy kernel choices).",
        )
        runs: int = Field(default=100, ge=1, le=10_000_000, description="Timed runs of the candidate (at least), spread over the rounds.")
        min_time_s: float = Field(
            default=0.0,
            ge=0.0,
            le=86_400,
            description="Keep timing until the candidate's runs add up to this many seconds (0: just `runs`).",
        )
        compare: bool = Field(
            default=True,
            description="Time the candidate against its target's reference in interleaved rounds (false: time it alone; no speedup is reported).",
        )
        runs_per_round: int = Field(default=10, ge=1, le=100_000, description="Timed runs of each model in one round.")
        sessions: int = Field(
            default=3,
            ge=1,
            le=1000,
            description=(
                "Fresh pairs of sessions the rounds are spread over (at least; more are opened while the interval is too wide). "
                "Each session lays out memory and threads anew, which moves a ratio by several percent from one opening to the "
                "next; the interval is bootstrapped over sessions and rounds, so it covers that too."
            ),
        )
        min_rounds: int = Field(default=6, ge=2, le=100_000, description="Rounds to take at least (each round times both models).")
        max_rounds: int = Field(
            default=80, ge=2, le=100_000, description="Rounds to take at most while the interval is still wider than `precision` asks."
        )
        precision: float = Field(
            default=0.05,
            gt=0,
            lt=1,
            description="Stop adding rounds once the speedup's confidence interval is within ± this fraction of the speedup (0.05 = ±5%).",
        )
        confidence: float = Field(default=0.95, gt=0, lt=1, description="Confidence of the interval the stopping rule uses.")
        max_time_s: float = Field(
            default=60.0, gt=0, le=86_400, description="Time budget for the rounds: stop adding rounds after this many seconds."
        )
        busy_cores: float = Field(
            default=0.3,
            gt=0,
            le=4096,
            description="Other processes (and hypervisor steal) using more than this many cores during a round make it a busy round: thrown away and re-measured once quiet.",
        )
        quiet_wait_s: float = Field(
            default=30.0,
            ge=0,
            le=86_400,
            description="Seconds, in all, to spend waiting for a busy machine to become quiet; after that busy rounds are kept and flagged.",
        )

        @model_validator(mode="after")
        def _rounds_order(self) -> Latency.Config:
            if self.max_rounds < self.min_rounds:
                raise ValueError(f"max_rounds ({self.max_rounds}) is below min_rounds ({self.min_rounds})")
            return self

    config: Config

    def evaluate(self, model: ModelArtifact, ctx: EvalContext) -> MetricResult:
        cfg = self.config
        batch = dataset_batch(ctx, cfg)
        compared = cfg.compare and ctx.reference is not None
        rounds = _Rounds(cfg, arms=2 if compared else 1)
        first: _Arm | None = None
        load_ms = 0.0
        while True:
            # one block: a fresh pair of sessions, warmed up, timed for a few rounds, closed
            opened: list[Session] = []
            try:
                started = time.perf_counter_ns()
                candidate = open_session(ctx, model, "candidate")
                opened.append(candidate)
                if first is None:
                    load_ms = (time.perf_counter_ns() - started) / 1e6
                arms = [_Arm("candidate" if compared else "model", candidate, feeds_for(candidate, cfg, batch))]
                if compared:
                    assert ctx.reference is not None
                    reference = open_session(ctx, ctx.reference, "reference")
                    opened.append(reference)
                    arms.insert(0, _Arm("reference", reference, feeds_for(reference, cfg, batch)))
                first = first or arms[-1]
                for arm in arms:
                    arm.warm_up(cfg.warmup)
                rounds.block(arms)
            finally:
                for session in opened:
                    session.close()
            if rounds.enough():
                break
        assert first is not None
        return self._result(rounds, first, load_ms, ctx, batch is not None)

    def _result(self, rounds: _Rounds, cand: _Arm, load_ms: float, ctx: EvalContext, from_data: bool) -> MetricResult:
        import numpy as np

        cfg = self.config
        ms = np.asarray(rounds.times_ns[-1], dtype=np.float64) / 1e6
        p50, p90, p95, p99 = (float(v) for v in np.percentile(ms, [50, 90, 95, 99]))
        mean = float(ms.mean())
        values = {
            "mean_ms": mean,
            "p50_ms": p50,
            "p90_ms": p90,
            "p95_ms": p95,
            "p99_ms": p99,
            "std_ms": float(ms.std()),
            "min_ms": float(ms.min()),
            "max_ms": float(ms.max()),
            "throughput_per_s": cfg.batch_size / (mean / 1e3) if mean > 0 else float("inf"),
            "load_ms": load_ms,
            "rounds": float(len(rounds.kept)),
            "others_cores": rounds.mean_others(),
        }
        blocks = [r.block for r in rounds.kept]
        samples = {"p50_ms": Samples("median", [r.medians_ms[-1] for r in rounds.kept], blocks)}
        compared = rounds.arms == 2
        if compared:
            ratios = rounds.ratios()
            interval = rounds.interval()
            values |= {
                "speedup": interval.estimate,
                "speedup_low": interval.low,
                "speedup_high": interval.high,
                "reference_p50_ms": float(np.median(np.asarray(rounds.times_ns[0], dtype=np.float64) / 1e6)),
            }
            samples["speedup"] = Samples("median", ratios, blocks)
        elif ctx.reference is None:
            # the reference itself: speedup 1 by definition (a candidate timed alone has none)
            values |= {"speedup": 1.0, "speedup_low": 1.0, "speedup_high": 1.0, "reference_p50_ms": p50}
        feeds = cand.feeds
        details: dict[str, Any] = {
            "method": "interleaved rounds against the reference" if compared else "rounds, alone",
            "runs": len(ms),
            "warmup": cfg.warmup,
            "runs_per_round": cfg.runs_per_round,
            "sessions": rounds.blocks,
            "rounds": len(rounds.kept),
            "rounds_thrown_away": rounds.discarded,
            "stopped_because": rounds.stop_reason,
            "precision": cfg.precision,
            "confidence": cfg.confidence,
            "interval_half_width": (values["speedup_high"] - values["speedup_low"]) / 2 / values["speedup"] if compared else None,
            "noise": rounds.noise(),
            "batch_size": cfg.batch_size,
            "sequence_length": _sequence_length(feeds, cfg.sequence_length),
            "feeds": "dataset" if from_data else "synthetic",
            "data": cfg.data,
            "input_shapes": {name: list(array.shape) for name, array in feeds.items()},
            "input_dtypes": {name: str(array.dtype) for name, array in feeds.items()},
            "total_s": float(ms.sum()) / 1e3,
            "min_time_s": cfg.min_time_s,
            "load_ms": load_ms,
            "session": dict(cand.session.details),
            "target": ctx.target.id,
        }
        if "precision_hint" in cand.session.details:
            details["precision_hint"] = cand.session.details["precision_hint"]
        logger.debug(
            "latency on %s: p50 %.3f ms, speedup %.3f [%.3f, %.3f] over %d rounds",
            ctx.target.id,
            p50,
            values.get("speedup", float("nan")),
            values.get("speedup_low", float("nan")),
            values.get("speedup_high", float("nan")),
            len(rounds.kept),
        )
        return MetricResult(values=values, details=details, samples=samples)


@dataclass
class _Arm:
    """One model under the clock: its session, its feeds, every timed run."""

    role: str
    session: Session
    feeds: dict[str, np.ndarray]

    def warm_up(self, runs: int) -> None:
        for _ in range(runs):
            run_session(self.session, self.feeds, self.role)
        self.session.synchronize()

    def time(self, runs: int) -> list[int]:
        """``runs`` timed runs; each is bracketed by device synchronization, so a GPU's queued
        work is counted in the run that queued it."""
        session, feeds, role = self.session, self.feeds, self.role
        out = []
        for _ in range(runs):
            session.synchronize()
            start = time.perf_counter_ns()
            run_session(session, feeds, role)
            session.synchronize()
            out.append(time.perf_counter_ns() - start)
        return out


@dataclass
class _Round:
    medians_ms: list[float]  # per arm, in arm order
    times_ns: list[list[int]]
    load: Load
    busy: bool
    block: int  # which pair of sessions it ran on


class _Rounds:
    """The interleaved rounds, block by block (a block: one pair of sessions), and the rules
    that decide when they are enough."""

    def __init__(self, cfg: Latency.Config, arms: int) -> None:
        self.cfg = cfg
        self.arms = arms
        self.kept: list[_Round] = []
        self.times_ns: list[list[int]] = [[] for _ in range(arms)]  # every kept run, per arm
        self.blocks = 0
        self.discarded = 0
        self.waited_s = 0.0
        self.stop_reason = ""
        self._meter = NoiseMeter()
        self._window_started: float | None = None
        self._quiet_budget = cfg.quiet_wait_s
        self._started = time.perf_counter()

    @property
    def per_block(self) -> int:
        return max(2, -(-self.cfg.min_rounds // self.cfg.sessions))

    def block(self, arms: list[_Arm]) -> None:
        """Take ``per_block`` rounds on these sessions; a busy round is thrown away and taken
        again once the machine is quiet, until the quiet budget is spent."""
        taken = 0
        while taken < self.per_block:
            current = self._take(arms, len(self.kept) + self.discarded)
            if current.busy and self._quiet_budget > 0:
                self.discarded += 1
                _, waited = self._meter.wait_for_quiet(self.cfg.busy_cores, self._quiet_budget)
                self.waited_s += waited
                self._quiet_budget -= waited
                continue
            self.kept.append(current)
            for i, times in enumerate(current.times_ns):
                self.times_ns[i].extend(times)
            taken += 1
        self.blocks += 1

    def _take(self, arms: list[_Arm], index: int) -> _Round:
        """One round: every arm times ``runs_per_round`` runs, in an order that alternates
        between rounds (A B, B A, ...) so a trend within a round favours neither."""
        order = list(range(len(arms)))
        if index % 2:
            order.reverse()
        times: list[list[int]] = [[] for _ in arms]
        # the kernel counts CPU time in 10 ms ticks: a round shorter than LOAD_WINDOW_S is
        # judged on the load since the window began, which may span a few earlier rounds
        if self._window_started is None or time.perf_counter() - self._window_started >= LOAD_WINDOW_S:
            self._meter.start()
            self._window_started = time.perf_counter()
        for i in order:
            times[i] = arms[i].time(self.cfg.runs_per_round)
        load = self._meter.stop()
        medians = [_median_ms(t) for t in times]
        return _Round(medians, times, load, load.busy(self.cfg.busy_cores), self.blocks)

    def ratios(self) -> list[float]:
        """Per round: the reference's median time over the candidate's (> 1: the candidate is faster)."""
        return [r.medians_ms[0] / r.medians_ms[-1] for r in self.kept]

    def interval(self) -> Interval:
        """The speedup's interval, bootstrapped over sessions, then rounds within them."""
        return bootstrap(self.ratios(), "median", self.cfg.confidence, groups=[r.block for r in self.kept])

    def enough(self) -> bool:
        """Checked after each block; sets ``stop_reason`` when the rounds are enough."""
        self.stop_reason = self._reason(time.perf_counter() - self._started - self.waited_s)
        return bool(self.stop_reason)

    def _reason(self, elapsed_s: float) -> str:
        cfg = self.cfg
        rounds = len(self.kept)
        if self.blocks < cfg.sessions or rounds < cfg.min_rounds:
            return ""
        if elapsed_s >= cfg.max_time_s:
            return f"max_time_s ({cfg.max_time_s:g} s) spent"
        runs = len(self.times_ns[-1])
        timed_s = sum(self.times_ns[-1]) / 1e9
        if runs < cfg.runs or timed_s < cfg.min_time_s:
            return ""
        if self.arms == 1:
            return "runs done"
        interval = self.interval()
        if interval.half_width <= cfg.precision * interval.estimate:
            return f"interval within ±{cfg.precision:.0%}"
        if rounds >= cfg.max_rounds:
            return f"max_rounds ({cfg.max_rounds}) reached"
        return ""

    def mean_others(self) -> float:
        return sum(r.load.others_cores for r in self.kept) / len(self.kept) if self.kept else 0.0

    def noise(self) -> dict[str, Any]:
        busy = [r for r in self.kept if r.busy]
        return {
            "others_cores_mean": self.mean_others(),
            "others_cores_max": max((r.load.others_cores for r in self.kept), default=0.0),
            "steal_cores_mean": sum(r.load.steal_cores for r in self.kept) / len(self.kept) if self.kept else 0.0,
            "busy_cores_threshold": self.cfg.busy_cores,
            "busy_rounds_kept": len(busy),
            "rounds_thrown_away": self.discarded,
            "waited_for_quiet_s": round(self.waited_s, 2),
            # measured under load: some rounds were kept although others kept the machine busy
            "loaded": bool(busy),
        }


def _median_ms(times_ns: list[int]) -> float:
    ordered = sorted(times_ns)
    mid = len(ordered) // 2
    value = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return value / 1e6


def _sequence_length(feeds: dict[str, np.ndarray], default: int) -> int:
    """The second axis of the 2-D (token-like) feeds, else the configured length."""
    for array in feeds.values():
        if array.ndim >= 2:
            return int(array.shape[1])
    return default
