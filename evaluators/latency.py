"""Latency: wall-clock time of one inference, over many runs after a warm-up.

numpy is imported inside ``evaluate``: the engine imports this module at validate time to read
``Config``, and ``engine --help`` must stay fast.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from pydantic import Field

from engine.core.evaluator import EvalContext, Evaluator, MetricResult
from evaluators._sessions import FeedConfig, dataset_batch, feeds_for, open_session, run_session

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact
    from engine.core.target import Session

logger = logging.getLogger(__name__)


class Latency(Evaluator):
    name = "latency"
    summary = "Time per inference (mean, percentiles, spread) and throughput, after a warm-up; also the time to load the model."
    version = "1"
    timing = True
    metrics = ("mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "std_ms", "min_ms", "max_ms", "throughput_per_s", "load_ms")
    dataset_options = ("data",)

    class Config(FeedConfig):
        warmup: int = Field(default=10, ge=0, description="Untimed runs before measuring (caches, allocator, lazy kernel choices).")
        runs: int = Field(default=100, ge=1, description="Timed runs (at least).")
        min_time_s: float = Field(
            default=0.0, ge=0.0, description="Keep timing beyond `runs` until this many seconds of runs have passed (0: just `runs`)."
        )

    config: Config

    def _feeds(self, session: Session, ctx: EvalContext) -> dict[str, np.ndarray]:
        return feeds_for(session, self.config, dataset_batch(ctx, self.config))

    def evaluate(self, model: ModelArtifact, ctx: EvalContext) -> MetricResult:
        import numpy as np

        cfg = self.config
        started = time.perf_counter_ns()
        session = open_session(ctx, model)
        load_ms = (time.perf_counter_ns() - started) / 1e6
        try:
            feeds = self._feeds(session, ctx)
            for _ in range(cfg.warmup):
                run_session(session, feeds)
            times_ns = self._time(session, feeds)
        finally:
            session.close()

        ms = np.asarray(times_ns, dtype=np.float64) / 1e6
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
        }
        shapes = {name: list(array.shape) for name, array in feeds.items()}
        details: dict[str, Any] = {
            "runs": len(ms),
            "warmup": cfg.warmup,
            "batch_size": cfg.batch_size,
            "sequence_length": _sequence_length(feeds, cfg.sequence_length),
            "feeds": "dataset" if cfg.data else "synthetic",
            "data": cfg.data,
            "input_shapes": shapes,
            "input_dtypes": {name: str(array.dtype) for name, array in feeds.items()},
            "total_s": float(ms.sum()) / 1e3,
            "min_time_s": cfg.min_time_s,
            "load_ms": load_ms,
            "session": dict(session.details),
            "target": ctx.target.id,
        }
        if "precision_hint" in session.details:
            details["precision_hint"] = session.details["precision_hint"]
        logger.debug("latency of %s on %s: p50 %.3f ms over %d runs", model.digest[:12], ctx.target.id, p50, len(ms))
        return MetricResult(values=values, details=details)

    def _time(self, session: Session, feeds: dict[str, np.ndarray]) -> list[int]:
        cfg = self.config
        min_time_ns = int(cfg.min_time_s * 1e9)
        times: list[int] = []
        total = 0
        while len(times) < cfg.runs or total < min_time_ns:
            start = time.perf_counter_ns()
            run_session(session, feeds)
            elapsed = time.perf_counter_ns() - start
            times.append(elapsed)
            total += elapsed
        return times


def _sequence_length(feeds: dict[str, np.ndarray], default: int) -> int:
    """The second axis of the 2-D (token-like) feeds, else the configured length."""
    for array in feeds.values():
        if array.ndim >= 2:
            return int(array.shape[1])
    return default
