"""The clock of the latency evaluator: a model under the clock (``Arm``) and the interleaved
rounds of reference and candidate, block by block, with the rules that decide when they are
enough (``Rounds``). numpy is imported inside functions."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from engine.core.stats import Interval, bootstrap
from evaluators._noise import Load, NoiseMeter
from evaluators._sessions import RUN_ERRORS, decided_against_compared, io_binding, prepare_run, run_failed, slower_than_compared

if TYPE_CHECKING:
    import numpy as np

    from engine.core.target import Session

#: the shortest stretch whose load is judged on its own (the kernel's CPU counters tick every 10 ms)
LOAD_WINDOW_S = 0.1
#: an untimed pause between one arm's runs and the next arm's: a runtime's idle worker threads
#: spin for a while after a run (ONNX Runtime's intra-op pool does, by default), and on a small
#: machine a pool still spinning takes the cores the other model's runs need; a pause lets it go
#: to sleep, and one untimed run then wakes the next arm's threads, so each arm is timed in the
#: steady state it would have alone
SETTLE_S = 0.01
#: untimed runs in a row whose times must agree before a warm-up may stop early
STEADY_RUNS = 3


class RoundsConfig(Protocol):
    """The options ``Rounds`` reads (latency's config; the generation evaluator's)."""

    @property
    def runs(self) -> int: ...
    @property
    def min_time_s(self) -> float: ...
    @property
    def runs_per_round(self) -> int: ...
    @property
    def sessions(self) -> int: ...
    @property
    def min_rounds(self) -> int: ...
    @property
    def max_rounds(self) -> int: ...
    @property
    def precision(self) -> float: ...
    @property
    def confidence(self) -> float: ...
    @property
    def stop_when_slower(self) -> bool: ...
    @property
    def stop_when_faster_than(self) -> float | None: ...
    @property
    def stop_when_within(self) -> float | None: ...
    @property
    def max_time_s(self) -> float: ...
    @property
    def busy_cores(self) -> float: ...
    @property
    def quiet_wait_s(self) -> float: ...


class Timed(Protocol):
    """What a round times: ``warm_up`` untimed, then ``time`` giving one duration (ns) per run."""

    def warm_up(self, runs: int) -> None: ...

    def time(self, runs: int) -> list[int]: ...


@dataclass
class Arm:
    """One model under the clock: its session, its feeds, every timed run. What is timed is the
    session's prepared run (``Session.prepare``: inputs and outputs bound on the device where
    the target can, so a run pays no host copies; the default is a plain ``run``)."""

    role: str
    session: Session
    feeds: dict[str, np.ndarray]
    call: Callable[[], None] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.call = prepare_run(self.session, self.feeds, self.role)

    @property
    def io_binding(self) -> str:
        return io_binding(self.session)

    def warm_up(self, runs: int) -> None:
        """``runs`` untimed prepared runs (the first ones may capture a CUDA graph)."""
        call = self.call
        try:
            for _ in range(runs):
                call()
            self.session.synchronize()
        except RUN_ERRORS as error:
            raise run_failed(self.feeds, self.role, error) from error

    def warm_up_until_steady(self, most: int, spread: float) -> int:
        """Untimed runs until the last ``STEADY_RUNS`` took times within ``spread`` of each
        other (the slowest at most ``1 + spread`` times the fastest), ``most`` at the most;
        returns how many were made. A fresh session's first runs are slow (the allocator's
        arenas grow, lazy kernels are chosen, a CUDA graph is captured); once three in a row
        agree that is over, and further untimed runs cost the evaluation time for nothing.
        ``spread`` 0 makes all ``most``."""
        if spread <= 0 or most <= STEADY_RUNS:
            self.warm_up(most)
            return most
        recent: list[int] = []
        for made in range(1, most + 1):
            recent = [*recent[-(STEADY_RUNS - 1) :], self.time(1)[0]]
            if len(recent) == STEADY_RUNS and max(recent) <= (1 + spread) * min(recent):
                return made
        return most

    def time(self, runs: int) -> list[int]:
        """``runs`` timed runs; each is bracketed by device synchronization, so a GPU's queued
        work is counted in the run that queued it."""
        session, call = self.session, self.call
        out = []
        try:
            for _ in range(runs):
                session.synchronize()
                start = time.perf_counter_ns()
                call()
                session.synchronize()
                out.append(time.perf_counter_ns() - start)
        except RUN_ERRORS as error:
            raise run_failed(self.feeds, self.role, error) from error
        return out


@dataclass
class Round:
    medians_ms: list[float]  # per arm, in arm order
    times_ns: list[list[int]]
    load: Load
    busy: bool
    block: int  # which pair of sessions it ran on


class Rounds:
    """The interleaved rounds, block by block (a block: one pair of sessions), and the rules
    that decide when they are enough."""

    def __init__(self, cfg: RoundsConfig, arms: int) -> None:
        self.cfg = cfg
        self.arms = arms
        self.kept: list[Round] = []
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

    def block(self, arms: Sequence[Timed]) -> None:
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

    def _take(self, arms: Sequence[Timed], index: int) -> Round:
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
        for position, i in enumerate(order):
            if len(arms) > 1:
                if position:
                    time.sleep(SETTLE_S)
                arms[i].warm_up(1)
            times[i] = arms[i].time(self.cfg.runs_per_round)
        load = self._meter.stop()
        medians = [median_ms(t) for t in times]
        return Round(medians, times, load, load.busy(self.cfg.busy_cores), self.blocks)

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
        interval = self.interval() if self.arms > 1 else None
        # a candidate slower than the model it is compared with beyond doubt is decided: it cannot
        # win against it, so its own figures need not reach `runs` / `min_time_s` (a decided
        # faster one still does: it may be chosen, and its percentiles are then reported)
        slower = slower_than_compared(cfg.stop_when_slower, interval) if interval is not None else ""
        if slower:
            return slower
        runs = len(self.times_ns[-1])
        timed_s = sum(self.times_ns[-1]) / 1e9
        if runs < cfg.runs or timed_s < cfg.min_time_s:
            return ""
        if interval is None:
            return "runs done"
        if interval.half_width <= cfg.precision * interval.estimate:
            return f"interval within ±{cfg.precision:.0%}"
        decided = decided_against_compared(cfg.stop_when_slower, cfg.stop_when_faster_than, interval, cfg.stop_when_within)
        if decided:
            return decided
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


def median_ms(times_ns: list[int]) -> float:
    ordered = sorted(times_ns)
    mid = len(ordered) // 2
    value = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return value / 1e6
