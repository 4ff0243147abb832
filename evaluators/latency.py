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

What is timed is a run as a deployed service makes it: the session's prepared run
(``Session.prepare``), which binds inputs and outputs on the device where the target can (ONNX
Runtime I/O binding, an OpenVINO request with its tensors set; needed for CUDA graphs, which the
warm-up runs capture), else a plain run with host arrays. Each run is bracketed by the session's
``synchronize``. The details say which each model used (``io_binding``, ``reference_io_binding``).
The reference runs on ``reference_target``: the target as written, while the candidate runs with
its searched session settings, so the speedup includes what those settings gain.

A decoder (a ``GenerativeSession``: a ``genai`` folder) is timed as one forward pass of
``sequence_length`` synthetic tokens (or a dataset row) from an empty cache: a prefill, not
generation (``details.decoder_timing`` says so). Time to first token and decode tokens per second
are the ``generation`` evaluator's; its cache inputs are not fed (see ``feeds_for``).

The usual figures (mean, percentiles, throughput of the candidate) are still reported, from all
of the candidate's timed runs. The reference itself is timed the same way, alone (speedup 1).

Start-up is measured too, as metrics of their own: ``startup_ms`` is the first session creation of
the candidate in this evaluation (cold: the runtime reads, optimizes or compiles the model for the
first time in this process; the details say whether this worker had opened the model before), and
``startup_warm_ms`` the median of the later creations (one per block of rounds, topped up to
``warm_starts`` with extra creations). ``load_ms`` is kept as it was (the first creation).

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
from engine.core.target import GenerativeSession
from evaluators._rounds import Arm, Rounds
from evaluators._sessions import ComparedTimingConfig, dataset_batch, feeds_for, open_reference, open_session

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact
    from engine.core.target import Session

logger = logging.getLogger(__name__)

#: session creations after the first that the warm start-up time is the median of (at least)
WARM_STARTS = 3

#: digests of the models this process has opened for timing: a model opened before is not cold
_OPENED: set[str] = set()


class Latency(Evaluator):
    name = "latency"
    summary = (
        "Time per inference as a comparison: the candidate and its target's reference timed in interleaved rounds, "
        "giving the speedup with a confidence interval, plus the candidate's percentiles, throughput and load time; "
        "rounds taken while other processes keep the machine busy are re-measured and flagged."
    )
    version = "5"  # 3: the warm-up stops once steady (warmup_spread); 4: stop_when_faster_than; 5: slower stops before `runs`
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
        "startup_ms",
        "startup_warm_ms",
        "speedup",
        "speedup_low",
        "speedup_high",
        "reference_p50_ms",
        "rounds",
        "others_cores",
    )
    paired_metrics = {"p50_ms": "speedup", "mean_ms": "speedup", "throughput_per_s": "speedup"}

    class Config(ComparedTimingConfig):
        warmup: int = Field(
            default=10,
            ge=0,
            le=100_000,
            description=(
                "Untimed runs of each model in each fresh session before measuring (caches, allocator, lazy kernel choices), "
                "at most: the warm-up stops earlier once three runs in a row agree within `warmup_spread`."
            ),
        )
        warmup_spread: float = Field(
            default=0.1,
            ge=0.0,
            le=10.0,
            description=(
                "The warm-up of a session ends once three untimed runs in a row took times within this fraction of each other "
                "(slowest <= (1 + spread) x fastest), or after `warmup` runs. 0: always all `warmup` runs."
            ),
        )
        runs: int = Field(
            default=100,
            ge=1,
            le=10_000_000,
            description=(
                "Timed runs of the candidate (at least), spread over the rounds; a candidate found slower than its reference "
                "beyond doubt (`stop_when_slower`) stops at `min_rounds` without them: it cannot be chosen over that reference."
            ),
        )
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
        warm_starts: int = Field(
            default=WARM_STARTS,
            ge=0,
            le=1000,
            description=(
                "Session creations after the first that `startup_warm_ms` is the median of, at least: the later blocks' own "
                "openings count, extra ones are made after the timing. 0 with a single session: `startup_warm_ms` is not reported."
            ),
        )
        max_rounds: int = Field(
            default=80, ge=2, le=100_000, description="Rounds to take at most while the interval is still wider than `precision` asks."
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
        rounds = Rounds(cfg, arms=2 if compared else 1)
        first: Arm | None = None
        cold = model.digest not in _OPENED
        starts_ms: list[float] = []  # every creation of the candidate's session, the first one first
        reference_binding: str | None = None
        warmed: list[int] = []  # untimed runs made before each arm's rounds, per session
        while True:
            # one block: a fresh pair of sessions, warmed up, timed for a few rounds, closed
            opened: list[Session] = []
            try:
                started = time.perf_counter_ns()
                candidate = open_session(ctx, model, "candidate")
                opened.append(candidate)
                starts_ms.append((time.perf_counter_ns() - started) / 1e6)
                _OPENED.add(model.digest)
                arms = [Arm("candidate" if compared else "model", candidate, feeds_for(candidate, cfg, batch))]
                if compared:
                    assert ctx.reference is not None
                    reference = open_reference(ctx)
                    opened.append(reference)
                    arms.insert(0, Arm("reference", reference, feeds_for(reference, cfg, batch)))
                    reference_binding = arms[0].io_binding
                first = first or arms[-1]
                for arm in arms:
                    warmed.append(arm.warm_up_until_steady(cfg.warmup, cfg.warmup_spread))
                rounds.block(arms)
            finally:
                for session in opened:
                    session.close()
            if rounds.enough():
                break
        assert first is not None
        while len(starts_ms) < cfg.warm_starts + 1:
            started = time.perf_counter_ns()
            open_session(ctx, model, "candidate").close()
            starts_ms.append((time.perf_counter_ns() - started) / 1e6)
        startup = Startup(starts_ms[0], starts_ms[1:], cold)
        result = self._result(rounds, first, startup, ctx, batch is not None)
        result.details["warmup_runs"] = {"most": cfg.warmup, "made": warmed, "spread": cfg.warmup_spread}
        if isinstance(first.session, GenerativeSession):
            result.details["decoder_timing"] = "prefill: one forward pass from an empty cache; the generation evaluator times decoding"
        if reference_binding is not None:
            result.details["reference_io_binding"] = reference_binding
            result.details["reference_target"] = ctx.reference_on.id
        return result

    def _result(self, rounds: Rounds, cand: Arm, startup: Startup, ctx: EvalContext, from_data: bool) -> MetricResult:
        import numpy as np

        cfg = self.config
        load_ms = startup.first_ms
        ms = np.asarray(rounds.times_ns[-1], dtype=np.float64) / 1e6
        values, samples = self._values(rounds, ms, startup, ctx)
        p50 = values["p50_ms"]
        compared = rounds.arms == 2
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
            "startup": startup.to_json(),
            "session": dict(cand.session.details),
            "io_binding": cand.io_binding,
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

    def _values(self, rounds: Rounds, ms: np.ndarray, startup: Startup, ctx: EvalContext) -> tuple[dict[str, float], dict[str, Samples]]:
        """The figures of the candidate's timed runs (``ms``), and the speedup over the reference."""
        import numpy as np

        cfg = self.config
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
            "load_ms": startup.first_ms,
            "startup_ms": startup.first_ms,
            **({"startup_warm_ms": startup.warm_ms} if startup.later_ms else {}),
            "rounds": float(len(rounds.kept)),
            "others_cores": rounds.mean_others(),
        }
        blocks = [r.block for r in rounds.kept]
        samples = {"p50_ms": Samples("median", [r.medians_ms[-1] for r in rounds.kept], blocks)}
        if rounds.arms == 2:
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
        return values, samples


@dataclass(frozen=True)
class Startup:
    """Session creation times of the candidate: the first one (``startup_ms``) and the later ones
    (their median is ``startup_warm_ms``)."""

    first_ms: float
    later_ms: list[float]
    cold: bool  # no session of this model was opened for timing in this process before

    @property
    def warm_ms(self) -> float | None:
        import numpy as np

        return float(np.median(self.later_ms)) if self.later_ms else None

    def to_json(self) -> dict[str, Any]:
        return {
            "cold_ms": self.first_ms,
            "cold": self.cold,
            "warm_ms": self.warm_ms,
            "warm_count": len(self.later_ms),
            "warm_samples_ms": [round(value, 3) for value in self.later_ms],
        }


def _sequence_length(feeds: dict[str, np.ndarray], default: int) -> int:
    """The second axis of the 2-D (token-like) feeds, else the configured length."""
    for array in feeds.values():
        if array.ndim >= 2:
            return int(array.shape[1])
    return default
