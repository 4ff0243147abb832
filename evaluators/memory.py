"""Memory: the resident memory a model takes to load and to run, measured in the worker process.

Two readings are combined: a thread samples the process's RSS (psutil) every few milliseconds, and
the kernel's high-water mark ``ru_maxrss`` is read before and after each phase: when it rises
during a phase, the phase set a new peak and that peak is exact (a sampler can miss a short spike).
The worker is a fresh process per job, so ``ru_maxrss`` is this job's own peak.

psutil and numpy are imported inside functions: the engine imports this module at validate time.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
from typing import TYPE_CHECKING, Any

from pydantic import Field

from engine.core.errors import MissingDependency
from engine.core.evaluator import EvalContext, Evaluator, MetricResult
from engine.core.target import GenerativeSession
from evaluators._sessions import RUN_ERRORS, FeedConfig, dataset_batch, feeds_for, io_binding, open_session, prepare_run, run_failed
from evaluators._tokens import generate, prompt_rows

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact
    from engine.core.target import Session

logger = logging.getLogger(__name__)

MIB = 2**20
#: tokens a decoder generates per prompt and run when ``max_new_tokens`` is not set
DEFAULT_NEW_TOKENS = 32


def max_rss_bytes() -> int | None:
    """The process's peak resident memory so far, from the kernel; None where unknown."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # bytes on macOS, KiB on Linux


class RssSampler:
    """Samples the RSS of this process in a thread; ``peak()`` is the highest seen since ``reset()``."""

    def __init__(self, interval_s: float) -> None:
        try:
            import psutil
        except ImportError as error:
            raise MissingDependency("psutil", "the memory evaluator") from error
        self._process = psutil.Process()
        self._interval = interval_s
        self._peak = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kiln-rss-sampler", daemon=True)
        self.samples = 0

    def rss(self) -> int:
        value = int(self._process.memory_info().rss)
        with self._lock:
            self._peak = max(self._peak, value)
            self.samples += 1
        return value

    def reset(self) -> int:
        """Start a new phase: the peak becomes the current RSS, which is returned."""
        value = int(self._process.memory_info().rss)
        with self._lock:
            self._peak = value
        return value

    def peak(self) -> int:
        self.rss()
        with self._lock:
            return self._peak

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.rss()

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _phase_peak(sampled: int, maxrss_before: int | None, maxrss_after: int | None) -> tuple[int, str]:
    """The peak of a phase: the kernel's new high-water mark if the phase raised it, else the sampled peak."""
    if maxrss_before is not None and maxrss_after is not None and maxrss_after > maxrss_before:
        return max(sampled, maxrss_after), "ru_maxrss"
    return sampled, "sampled"


class Memory(Evaluator):
    """``peak_rss_mb``: the process's peak resident memory while the model is loaded and run
    (interpreter and libraries included; a spike before the load, such as reading the dataset, is
    left out but shown in the details as ``ru_maxrss_end_mb``), ``load_delta_mb``: what opening the
    session added (peak during the load minus the RSS before it), ``run_delta_mb``: what running
    added on top of the loaded model (peak during the runs minus the RSS after the load). MiB
    (2**20 bytes); deltas are never below 0. Run in a fresh worker process per job, as the engine
    does: the kernel's high-water mark then belongs to this job alone. The runs are the session's
    prepared runs (``Session.prepare``, as the latency evaluator times them): where the target
    binds inputs and outputs on its device, what that binding holds is part of the run peak.
    A decoder opened as a generative session (``genai`` format) is run as it is used: each run is
    a greedy generation of ``max_new_tokens`` tokens from every row of the batch (the tokens where
    ``attention_mask`` is 1), so the run peak includes the key/value cache at its longest. Only
    the model measured is loaded: the reference is never opened here."""

    name = "memory"
    summary = "Peak resident memory while a model loads and runs, and the memory added by loading it and by running it (MiB)."
    deployed_sessions = True
    version = "1"
    metrics = ("peak_rss_mb", "load_delta_mb", "run_delta_mb")
    libraries = ("psutil",)

    class Config(FeedConfig):
        runs: int = Field(default=10, ge=1, description="Inferences run after the load (the run peak is the highest over them).")
        sample_interval_ms: float = Field(
            default=2.0, gt=0.0, le=1000.0, description="How often the RSS is sampled while loading and running."
        )
        max_new_tokens: int | None = Field(
            default=None,
            ge=2,
            le=1_000_000,
            description=(
                "For a decoder (genai format, opened as a generative session): each run is a greedy generation of this many "
                f"tokens from every row of the batch, so the run peak holds the key/value cache at its longest. Omit for {DEFAULT_NEW_TOKENS}."
            ),
        )

        def to_json(self) -> dict[str, Any]:
            """As the base's; ``max_new_tokens`` appears only when set, so configs without it keep their keys."""
            data = super().to_json()
            if data.get("max_new_tokens") is None:
                data.pop("max_new_tokens", None)
            return data

    config: Config

    @property
    def new_tokens(self) -> int:
        return self.config.max_new_tokens if self.config.max_new_tokens is not None else DEFAULT_NEW_TOKENS

    def _run(self, session: Session, feeds: dict[str, np.ndarray]) -> int:
        """The measured runs: greedy generations from each prompt row for a decoder (returns the
        number of prompts), else the session's prepared run (returns 0)."""
        cfg = self.config
        if isinstance(session, GenerativeSession):
            prompts = prompt_rows(feeds)
            for _ in range(cfg.runs):
                for prompt in prompts:
                    generate(session, prompt, self.new_tokens, "model")
            session.synchronize()
            return len(prompts)
        call = prepare_run(session, feeds)
        try:
            for _ in range(cfg.runs):
                call()
            session.synchronize()
        except RUN_ERRORS as error:
            raise run_failed(feeds, "model", error) from error
        return 0

    def evaluate(self, model: ModelArtifact, ctx: EvalContext) -> MetricResult:
        cfg = self.config
        batch = dataset_batch(ctx, cfg)
        gc.collect()
        with RssSampler(cfg.sample_interval_ms / 1000) as sampler:
            before = sampler.reset()
            maxrss_start = max_rss_bytes()
            session = open_session(ctx, model)
            try:
                load_sampled = sampler.peak()
                maxrss_loaded = max_rss_bytes()
                after_load = sampler.reset()
                feeds = feeds_for(session, cfg, batch)
                generating = self._run(session, feeds)
                run_sampled = sampler.peak()
                maxrss_end = max_rss_bytes()
            finally:
                session.close()
        load_peak, load_source = _phase_peak(load_sampled, maxrss_start, maxrss_loaded)
        run_peak, run_source = _phase_peak(run_sampled, maxrss_loaded, maxrss_end)
        peak = max(load_peak, run_peak)
        values = {
            "peak_rss_mb": peak / MIB,
            "load_delta_mb": max(0, load_peak - before) / MIB,
            "run_delta_mb": max(0, run_peak - after_load) / MIB,
        }
        details: dict[str, Any] = {
            "rss_before_load_mb": before / MIB,
            "rss_after_load_mb": after_load / MIB,
            "load_peak_mb": load_peak / MIB,
            "load_peak_from": load_source,
            "run_peak_mb": run_peak / MIB,
            "run_peak_from": run_source,
            "ru_maxrss_before_load_mb": None if maxrss_start is None else maxrss_start / MIB,
            "ru_maxrss_end_mb": None if maxrss_end is None else maxrss_end / MIB,
            "rss_samples": sampler.samples,
            "sample_interval_ms": cfg.sample_interval_ms,
            "runs": cfg.runs,
            "batch_size": cfg.batch_size,
            "feeds": "dataset" if cfg.data else "synthetic",
            "data": cfg.data,
            "input_shapes": {name: list(array.shape) for name, array in feeds.items()},
            "session": dict(session.details),
            "io_binding": io_binding(session),
            "target": ctx.target.id,
        }
        if generating:
            details["generation"] = {"max_new_tokens": self.new_tokens, "prompts": generating, "sampling": "greedy"}
        logger.debug("memory of %s: peak %.1f MiB, load +%.1f MiB", model.digest[:12], values["peak_rss_mb"], values["load_delta_mb"])
        return MetricResult(values=values, details=details)
