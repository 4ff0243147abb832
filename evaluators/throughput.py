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
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from engine.core.evaluator import EvalContext, Evaluator, MetricResult, Samples
from engine.core.stats import Interval
from evaluators._sessions import (
    ComparedTimingConfig,
    dataset_batch,
    open_reference,
    open_session,
)
from evaluators._windows import LoadArm, Windows

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact
    from engine.core.target import Session

logger = logging.getLogger(__name__)


class Throughput(Evaluator):
    name = "throughput"
    summary = (
        "Items per second with `concurrency` requests in flight (threads on one session, or one session per thread), "
        "compared with the target's reference in alternating timed windows (speedup with a confidence interval), "
        "plus per-request latency percentiles under that load."
    )
    version = "2"  # 2: stop_when_faster_than
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
        windows = Windows(cfg, arms=2 if compared else 1)
        per_session = cfg.concurrency if cfg.mode == "sessions" else 1
        facts: dict[str, Any] = {}
        with ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="kiln-throughput") as pool:
            while True:
                # one block: fresh sessions for each model, warmed up, timed for a few window pairs, closed
                opened: list[Session] = []
                try:
                    arms: list[LoadArm] = []
                    for role in ("reference", "candidate") if compared else ("model",):
                        sessions = []
                        for _ in range(per_session):
                            session = open_reference(ctx) if role == "reference" else open_session(ctx, model, role)
                            opened.append(session)
                            sessions.append(session)
                        arms.append(LoadArm.build(role, sessions, cfg, batch))
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

    def _result(self, windows: Windows, facts: dict[str, Any], ctx: EvalContext, from_data: bool) -> MetricResult:
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
        details = self._details(windows, facts, ctx, from_data, interval, requests, seconds)
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

    def _details(
        self,
        windows: Windows,
        facts: dict[str, Any],
        ctx: EvalContext,
        from_data: bool,
        interval: Interval | None,
        requests: int,
        seconds: float,
    ) -> dict[str, Any]:
        """How the windows were taken: what a reader needs to trust the figures."""
        cfg = self.config
        cand = [w.per_arm[-1] for w in windows.kept]
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
        return details
