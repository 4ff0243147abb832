"""Throughput: how many items a model serves per second with several requests in flight at once,
measured as a comparison with the reference model, and the per-request latency under that load.

``concurrency`` requests are kept in flight: ``mode: threads`` runs that many threads on one
session, each through ``Session.concurrent()`` (a run function for one more serving thread: ONNX
Runtime's session called from every thread, an OpenVINO infer request per thread), with the feeds
given as host arrays on every call, copied in and out as a server's requests are; ``mode:
sessions`` opens that many sessions, one thread each, each through its prepared run
(``Session.prepare``: bound on the device where the target can). A timed window starts every
thread at once (a barrier), each runs requests back to back until the window's ``window_s`` is
over, timing each request; the window lasts until the last request ends, and its throughput is
the requests completed (times ``batch_size`` for items) over that time.

As for latency, a figure alone says little on a shared machine, so the reference (opened on the
target as written, ``EvalContext.reference_on``) and the candidate take windows in turn, the order
alternating (reference then candidate, candidate then reference, ...), and what is reported first
is the **speedup**: the median over window pairs of the candidate's throughput over the
reference's, with a bootstrap interval clustered by the pair of openings the windows ran on.
Window pairs are added until the interval is within ``precision`` or ``max_time_s`` is spent; a
pair taken while other processes kept the machine busy is thrown away and taken again once it is
quiet (up to ``quiet_wait_s``), else kept and flagged. The reference measured alone has speedup 1.

numpy is imported inside functions: the engine imports this module at validate time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from engine.core.evaluator import EvalContext, Evaluator, MetricResult, Samples
from engine.core.stats import Interval, bootstrap
from evaluators._noise import Load, NoiseMeter
from evaluators._sessions import (
    RUN_ERRORS,
    ComparedTimingConfig,
    dataset_batch,
    feeds_for,
    io_binding,
    open_reference,
    open_session,
    prepare_run,
    run_failed,
)

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact
    from engine.core.target import Session

logger = logging.getLogger(__name__)

#: how long a thread waits for the others at a window's start before the window is given up
BARRIER_TIMEOUT_S = 120.0


class Throughput(Evaluator):
    name = "throughput"
    summary = (
        "Items per second with `concurrency` requests in flight (threads on one session, or one session per thread), "
        "compared with the target's reference in alternating timed windows (speedup with a confidence interval), "
        "plus per-request latency percentiles under that load."
    )
    version = "1"
    timing = True
    needs_reference = True
    metrics = (
        "items_per_s",
        "requests_per_s",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "speedup",
        "speedup_low",
        "speedup_high",
        "reference_items_per_s",
        "windows",
        "others_cores",
    )
    paired_metrics = {"items_per_s": "speedup", "requests_per_s": "speedup"}

    class Config(ComparedTimingConfig):
        concurrency: int = Field(default=1, ge=1, le=1024, description="Requests in flight at once (threads serving them).")
        mode: Literal["threads", "sessions"] = Field(
            default="threads",
            description=(
                "threads: `concurrency` threads share one session, each calling it with host arrays as a server does; "
                "sessions: `concurrency` sessions, one thread each, each running its prepared (device-bound where possible) run."
            ),
        )
        window_s: float = Field(default=1.0, gt=0, le=3600, description="Length of one timed window (seconds) per model.")
        warmup: int = Field(default=10, ge=0, le=100_000, description="Untimed runs of each serving thread before the windows.")
        sessions: int = Field(
            default=2,
            ge=1,
            le=1000,
            description="Fresh openings of the models the windows are spread over (at least); the interval is bootstrapped over them.",
        )
        min_windows: int = Field(default=4, ge=2, le=100_000, description="Windows of each model to take at least.")
        max_windows: int = Field(
            default=40,
            ge=2,
            le=100_000,
            description="Windows of each model to take at most while the interval is wider than `precision` asks.",
        )
        compare: bool = Field(
            default=True,
            description="Time the candidate against its target's reference in alternating windows (false: alone; no speedup is reported).",
        )

        @model_validator(mode="after")
        def _windows_order(self) -> Throughput.Config:
            if self.max_windows < self.min_windows:
                raise ValueError(f"max_windows ({self.max_windows}) is below min_windows ({self.min_windows})")
            return self

    config: Config

    def evaluate(self, model: ModelArtifact, ctx: EvalContext) -> MetricResult:
        cfg = self.config
        batch = dataset_batch(ctx, cfg)
        compared = cfg.compare and ctx.reference is not None
        windows = _Windows(cfg, arms=2 if compared else 1)
        per_session = cfg.concurrency if cfg.mode == "sessions" else 1
        facts: dict[str, Any] = {}
        with ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="kiln-throughput") as pool:
            while True:
                # one block: fresh sessions for each model, warmed up, timed for a few window pairs, closed
                opened: list[Session] = []
                try:
                    arms: list[_Arm] = []
                    for role in ("reference", "candidate") if compared else ("model",):
                        sessions = []
                        for _ in range(per_session):
                            session = open_reference(ctx) if role == "reference" else open_session(ctx, model, role)
                            opened.append(session)
                            sessions.append(session)
                        arms.append(_Arm.build(role, sessions, cfg, batch))
                    facts = facts or arms[-1].facts(cfg)
                    if compared:
                        facts["reference_io_binding"] = arms[0].io_binding(cfg)
                    for arm in arms:
                        arm.warm_up(pool, cfg.warmup)
                    windows.block(arms, pool)
                finally:
                    for session in opened:
                        session.close()
                if windows.enough():
                    break
        return self._result(windows, facts, ctx, batch is not None)

    def _result(self, windows: _Windows, facts: dict[str, Any], ctx: EvalContext, from_data: bool) -> MetricResult:
        import numpy as np

        cfg = self.config
        cand = [w.per_arm[-1] for w in windows.kept]
        requests = sum(w.requests for w in cand)
        seconds = sum(w.elapsed_ns for w in cand) / 1e9
        ms = np.asarray([t for w in cand for t in w.times_ns], dtype=np.float64) / 1e6
        p50, p90, p99 = (float(v) for v in np.percentile(ms, [50, 90, 99]))
        rps = requests / seconds
        values: dict[str, float] = {
            "items_per_s": rps * cfg.batch_size,
            "requests_per_s": rps,
            "p50_ms": p50,
            "p90_ms": p90,
            "p99_ms": p99,
            "windows": float(len(windows.kept)),
            "others_cores": windows.mean_others(),
        }
        samples: dict[str, Samples] = {}
        blocks = [w.block for w in windows.kept]
        interval: Interval | None = None
        if windows.arms == 2:
            ref = [w.per_arm[0] for w in windows.kept]
            interval = windows.interval()
            values |= {
                "speedup": interval.estimate,
                "speedup_low": interval.low,
                "speedup_high": interval.high,
                "reference_items_per_s": sum(w.requests for w in ref) / (sum(w.elapsed_ns for w in ref) / 1e9) * cfg.batch_size,
            }
            samples["speedup"] = Samples("median", windows.ratios(), blocks)
        elif ctx.reference is None:
            # the reference itself: speedup 1 by definition (a candidate timed alone has none)
            values |= {"speedup": 1.0, "speedup_low": 1.0, "speedup_high": 1.0, "reference_items_per_s": values["items_per_s"]}
        details: dict[str, Any] = {
            "method": "alternating windows against the reference" if windows.arms == 2 else "windows, alone",
            **facts,
            "batch_size": cfg.batch_size,
            "window_s": cfg.window_s,
            "warmup": cfg.warmup,
            "windows": len(windows.kept),
            "windows_thrown_away": windows.discarded,
            "sessions": windows.blocks,
            "threads": max(w.threads for w in cand),
            "requests": requests,
            "total_s": seconds,
            "stopped_because": windows.stop_reason,
            "precision": cfg.precision,
            "confidence": cfg.confidence,
            "interval_half_width": interval.half_width / interval.estimate if interval is not None else None,
            "window_items_per_s": [round(w.requests * cfg.batch_size / (w.elapsed_ns / 1e9), 3) for w in cand],
            "noise": windows.noise(),
            "feeds": "dataset" if from_data else "synthetic",
            "data": cfg.data,
            "target": ctx.target.id,
        }
        if windows.arms == 2:
            details["reference_target"] = ctx.reference_on.id
        logger.debug(
            "throughput on %s (%s x%d): %.1f items/s, speedup %.3f over %d windows",
            ctx.target.id,
            cfg.mode,
            cfg.concurrency,
            values["items_per_s"],
            values.get("speedup", float("nan")),
            len(windows.kept),
        )
        return MetricResult(values=values, details=details, samples=samples)


@dataclass
class _Stream:
    """One serving thread's work: a request (``call``) and how to wait for its device work."""

    call: Callable[[], object]
    sync: Callable[[], None]
    feeds: dict[str, np.ndarray]


@dataclass
class _Window:
    """One model's timed window: requests completed, from the common start to the last end."""

    requests: int
    elapsed_ns: int
    times_ns: list[int]
    threads: int  # distinct threads that served it


@dataclass
class _Arm:
    """One model under load: its sessions and the streams (one per thread) that serve it."""

    role: str
    sessions: list[Session]
    streams: list[_Stream]

    @classmethod
    def build(cls, role: str, sessions: list[Session], cfg: Throughput.Config, batch: dict[str, np.ndarray] | None) -> _Arm:
        streams = []
        if cfg.mode == "threads":
            session = sessions[0]
            feeds = feeds_for(session, cfg, batch)
            for _ in range(cfg.concurrency):
                # host arrays in and out on every call: already synchronous
                streams.append(_Stream(_request(session.concurrent(), feeds), _no_sync, feeds))
        else:
            for session in sessions:
                feeds = feeds_for(session, cfg, batch)
                streams.append(_Stream(prepare_run(session, feeds, role), session.synchronize, feeds))
        return cls(role, sessions, streams)

    def io_binding(self, cfg: Throughput.Config) -> str:
        # threads call ``concurrent()`` with host arrays: nothing is bound on the device
        return io_binding(self.sessions[0]) if cfg.mode == "sessions" else "off"

    def facts(self, cfg: Throughput.Config) -> dict[str, Any]:
        feeds = self.streams[0].feeds
        return {
            "mode": cfg.mode,
            "concurrency": cfg.concurrency,
            "sessions_per_model": len(self.sessions),
            "io_binding": self.io_binding(cfg),
            "session": dict(self.sessions[0].details),
            "input_shapes": {name: list(array.shape) for name, array in feeds.items()},
            "input_dtypes": {name: str(array.dtype) for name, array in feeds.items()},
        }

    def warm_up(self, pool: ThreadPoolExecutor, runs: int) -> None:
        """``runs`` untimed requests on every stream, all streams at once."""

        def warm(stream: _Stream) -> None:
            for _ in range(runs):
                stream.call()
            stream.sync()

        self._gather([pool.submit(warm, stream) for stream in self.streams])

    def window(self, pool: ThreadPoolExecutor, window_s: float) -> _Window:
        """Every stream starts at once and runs requests back to back until ``window_s`` is over
        (each at least one); the window ends with the last request."""
        clock: dict[str, int] = {}

        def start() -> None:  # run by one thread when all have reached the barrier
            clock["start"] = time.perf_counter_ns()
            clock["deadline"] = clock["start"] + int(window_s * 1e9)

        barrier = threading.Barrier(len(self.streams), action=start)

        def serve(stream: _Stream) -> tuple[list[int], int, int]:
            call, sync = stream.call, stream.sync
            times: list[int] = []
            barrier.wait(BARRIER_TIMEOUT_S)
            deadline = clock["deadline"]
            while True:
                began = time.perf_counter_ns()
                call()
                sync()
                ended = time.perf_counter_ns()
                times.append(ended - began)
                if ended >= deadline:
                    return times, ended, threading.get_ident()

        results = self._gather([pool.submit(serve, stream) for stream in self.streams])
        times = [t for result in results for t in result[0]]
        last = max(result[1] for result in results)
        return _Window(len(times), max(1, last - clock["start"]), times, len({result[2] for result in results}))

    def _gather(self, futures: list[Any]) -> list[Any]:
        """The futures' results; a failed request becomes an EvaluationError (the first failure)."""
        results, failure = [], None
        for future in futures:
            try:
                results.append(future.result())
            except RUN_ERRORS as error:  # BrokenBarrierError too: a thread that never started
                failure = failure or error
        if failure is not None:
            raise run_failed(self.streams[0].feeds, self.role, failure) from failure
        return results


def _request(run: Callable[[dict[str, np.ndarray]], list[np.ndarray]], feeds: dict[str, np.ndarray]) -> Callable[[], object]:
    """One request of a serving thread: ``run`` (from ``Session.concurrent``) on the host feeds."""

    def request() -> object:
        return run(feeds)

    return request


def _no_sync() -> None:
    pass


@dataclass
class _Pair:
    per_arm: list[_Window]  # in arm order: the reference first when compared
    load: Load
    busy: bool
    block: int


class _Windows:
    """The alternating windows, block by block (a block: one opening of the models), and the
    rules that decide when they are enough."""

    def __init__(self, cfg: Throughput.Config, arms: int) -> None:
        self.cfg = cfg
        self.arms = arms
        self.kept: list[_Pair] = []
        self.blocks = 0
        self.discarded = 0
        self.waited_s = 0.0
        self.stop_reason = ""
        self._meter = NoiseMeter()
        self._quiet_budget = cfg.quiet_wait_s
        self._started = time.perf_counter()

    @property
    def per_block(self) -> int:
        return max(2, -(-self.cfg.min_windows // self.cfg.sessions))

    def block(self, arms: list[_Arm], pool: ThreadPoolExecutor) -> None:
        taken = 0
        while taken < self.per_block:
            order = list(range(len(arms)))
            if (len(self.kept) + self.discarded) % 2:
                order.reverse()
            per_arm: list[_Window | None] = [None] * len(arms)
            self._meter.start()
            for i in order:
                per_arm[i] = arms[i].window(pool, self.cfg.window_s)
            load = self._meter.stop()
            busy = load.busy(self.cfg.busy_cores)
            if busy and self._quiet_budget > 0:
                self.discarded += 1
                _, waited = self._meter.wait_for_quiet(self.cfg.busy_cores, self._quiet_budget)
                self.waited_s += waited
                self._quiet_budget -= waited
                continue
            self.kept.append(_Pair([w for w in per_arm if w is not None], load, busy, self.blocks))
            taken += 1
        self.blocks += 1

    def ratios(self) -> list[float]:
        """Per pair: the candidate's throughput over the reference's (> 1: the candidate serves more)."""
        return [_rate(p.per_arm[-1]) / _rate(p.per_arm[0]) for p in self.kept]

    def interval(self) -> Interval:
        return bootstrap(self.ratios(), "median", self.cfg.confidence, groups=[p.block for p in self.kept])

    def enough(self) -> bool:
        cfg = self.cfg
        self.stop_reason = ""
        elapsed = time.perf_counter() - self._started - self.waited_s
        if self.blocks < cfg.sessions or len(self.kept) < cfg.min_windows:
            return False
        if elapsed >= cfg.max_time_s:
            self.stop_reason = f"max_time_s ({cfg.max_time_s:g} s) spent"
        elif self.arms == 1:
            self.stop_reason = "windows done"
        else:
            interval = self.interval()
            if interval.half_width <= cfg.precision * interval.estimate:
                self.stop_reason = f"interval within ±{cfg.precision:.0%}"
            elif len(self.kept) >= cfg.max_windows:
                self.stop_reason = f"max_windows ({cfg.max_windows}) reached"
        return bool(self.stop_reason)

    def mean_others(self) -> float:
        return sum(p.load.others_cores for p in self.kept) / len(self.kept) if self.kept else 0.0

    def noise(self) -> dict[str, Any]:
        busy = [p for p in self.kept if p.busy]
        return {
            "others_cores_mean": self.mean_others(),
            "others_cores_max": max((p.load.others_cores for p in self.kept), default=0.0),
            "steal_cores_mean": sum(p.load.steal_cores for p in self.kept) / len(self.kept) if self.kept else 0.0,
            "busy_cores_threshold": self.cfg.busy_cores,
            # the keys latency's noise has (the engine's summary reads them): a round is a pair of windows
            "busy_rounds_kept": len(busy),
            "rounds_thrown_away": self.discarded,
            "waited_for_quiet_s": round(self.waited_s, 2),
            "loaded": bool(busy),
        }


def _rate(window: _Window) -> float:
    return window.requests / window.elapsed_ns
