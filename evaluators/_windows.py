"""The clock of the throughput evaluator: a model under load (``LoadArm``: its sessions and one
stream per serving thread), its timed windows, and the alternating windows of reference and
candidate with the rules that decide when they are enough (``Windows``). numpy is imported
inside functions."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.core.stats import Interval, bootstrap
from evaluators._noise import Load, NoiseMeter
from evaluators._sessions import RUN_ERRORS, decided_against_compared, feeds_for, io_binding, prepare_run, run_failed

if TYPE_CHECKING:
    import numpy as np

    from engine.core.target import Session
    from evaluators.throughput import Throughput

#: how long a thread waits for the others at a window's start before the window is given up
BARRIER_TIMEOUT_S = 120.0


@dataclass
class Stream:
    """One serving thread's work: a request (``call``) and how to wait for its device work."""

    call: Callable[[], object]
    sync: Callable[[], None]
    feeds: dict[str, np.ndarray]


@dataclass
class Window:
    """One model's timed window: requests completed, from the common start to the last end."""

    requests: int
    elapsed_ns: int
    times_ns: list[int]
    threads: int  # distinct threads that served it


@dataclass
class LoadArm:
    """One model under load: its sessions and the streams (one per thread) that serve it."""

    role: str
    sessions: list[Session]
    streams: list[Stream]

    @classmethod
    def build(cls, role: str, sessions: list[Session], cfg: Throughput.Config, batch: dict[str, np.ndarray] | None) -> LoadArm:
        streams = []
        if cfg.mode == "threads":
            session = sessions[0]
            feeds = feeds_for(session, cfg, batch)
            for _ in range(cfg.concurrency):
                # host arrays in and out on every call: already synchronous
                streams.append(Stream(request_of(session.concurrent(), feeds), no_sync, feeds))
        else:
            for session in sessions:
                feeds = feeds_for(session, cfg, batch)
                streams.append(Stream(prepare_run(session, feeds, role), session.synchronize, feeds))
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

        def warm(stream: Stream) -> None:
            for _ in range(runs):
                stream.call()
            stream.sync()

        self._gather([pool.submit(warm, stream) for stream in self.streams])

    def window(self, pool: ThreadPoolExecutor, window_s: float) -> Window:
        """Every stream starts at once and runs requests back to back until ``window_s`` is over
        (each at least one); the window ends with the last request."""
        clock: dict[str, int] = {}

        def start() -> None:  # run by one thread when all have reached the barrier
            clock["start"] = time.perf_counter_ns()
            clock["deadline"] = clock["start"] + int(window_s * 1e9)

        barrier = threading.Barrier(len(self.streams), action=start)

        def serve(stream: Stream) -> tuple[list[int], int, int]:
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
        return Window(len(times), max(1, last - clock["start"]), times, len({result[2] for result in results}))

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


def request_of(run: Callable[[dict[str, np.ndarray]], list[np.ndarray]], feeds: dict[str, np.ndarray]) -> Callable[[], object]:
    """One request of a serving thread: ``run`` (from ``Session.concurrent``) on the host feeds."""

    def request() -> object:
        return run(feeds)

    return request


def no_sync() -> None:
    pass


@dataclass
class Pair:
    per_arm: list[Window]  # in arm order: the reference first when compared
    load: Load
    busy: bool
    block: int


class Windows:
    """The alternating windows, block by block (a block: one opening of the models), and the
    rules that decide when they are enough."""

    def __init__(self, cfg: Throughput.Config, arms: int) -> None:
        self.cfg = cfg
        self.arms = arms
        self.kept: list[Pair] = []
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

    def block(self, arms: list[LoadArm], pool: ThreadPoolExecutor) -> None:
        taken = 0
        while taken < self.per_block:
            order = list(range(len(arms)))
            if (len(self.kept) + self.discarded) % 2:
                order.reverse()
            per_arm: list[Window | None] = [None] * len(arms)
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
            self.kept.append(Pair([w for w in per_arm if w is not None], load, busy, self.blocks))
            taken += 1
        self.blocks += 1

    def ratios(self) -> list[float]:
        """Per pair: the candidate's throughput over the reference's (> 1: the candidate serves more)."""
        return [rate(p.per_arm[-1]) / rate(p.per_arm[0]) for p in self.kept]

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
            decided = decided_against_compared(cfg.stop_when_slower, cfg.stop_when_faster_than, interval, cfg.stop_when_within)
            if interval.half_width <= cfg.precision * interval.estimate:
                self.stop_reason = f"interval within ±{cfg.precision:.0%}"
            elif decided:
                self.stop_reason = decided
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


def rate(window: Window) -> float:
    return window.requests / window.elapsed_ns
