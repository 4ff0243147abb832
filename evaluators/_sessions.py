"""Helpers the evaluators share: open and run sessions with failures told as ``EvaluationError``,
and pick from a dataset batch the feeds a session declares.

numpy is imported inside the functions: evaluator modules import this one at validate time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import Field

from engine.core.errors import EvaluationError, InputError, KilnError, MissingDependency, Problem, TargetUnavailable
from engine.core.evaluator import EvaluatorConfig
from engine.core.refs import DatasetRef
from engine.core.target import GenerativeSession

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact
    from engine.core.data import Dataset
    from engine.core.evaluator import EvalContext
    from engine.core.stats import Interval
    from engine.core.target import Session, Target, TensorSpec


def open_session(ctx: EvalContext, model: ModelArtifact, role: str = "model", target: Target | None = None) -> Session:
    """``target.open_session(model)`` (default ``ctx.target``; the reference is opened on
    ``ctx.reference_on``); a model the target cannot load becomes an EvaluationError (a missing
    library or an unavailable target keeps its own error)."""
    target = target if target is not None else ctx.target
    if model.format not in target.accepts:
        raise EvaluationError(
            f"target '{target.id}' ({target.runtime}) runs {', '.join(target.accepts)} models; the {role} is a {model.format} model"
        )
    try:
        return target.open_session(model)
    except (MissingDependency, TargetUnavailable, EvaluationError):
        raise
    except KilnError as error:
        raise EvaluationError(f"could not open the {role} on target '{target.id}': {error}") from error


def open_reference(ctx: EvalContext) -> Session:
    """The reference's session, on the target the reference runs on (``ctx.reference_on``: the
    target as the workflow writes it, not a candidate's searched session settings)."""
    assert ctx.reference is not None
    return open_session(ctx, ctx.reference, "reference", target=ctx.reference_on)


def run_session(session: Session, feeds: dict[str, np.ndarray], role: str = "model") -> list[np.ndarray]:
    try:
        return session.run(feeds)
    except EvaluationError:
        raise
    except KilnError as error:
        raise run_failed(feeds, role, error) from error


#: what a session's run may raise besides ``KilnError``: a runtime's own error from a prepared or
#: concurrent call, which a target may leave unwrapped since it runs under the clock
RUN_ERRORS = (KilnError, RuntimeError)


def run_failed(feeds: dict[str, np.ndarray], role: str, error: BaseException) -> EvaluationError:
    """The error telling that running ``role`` on ``feeds`` failed (raise it ``from error``)."""
    if isinstance(error, EvaluationError):
        return error
    shapes = ", ".join(f"{name} {list(array.shape)} {array.dtype}" for name, array in feeds.items())
    return EvaluationError(f"running the {role} failed on feeds ({shapes}): {error}")


def prepare_run(session: Session, feeds: dict[str, np.ndarray], role: str = "model") -> Callable[[], None]:
    """``session.prepare(feeds)``: one run made ready to repeat (bound on the device where the
    target can). A failure while preparing is an EvaluationError; the returned call is not wrapped
    (timing loops wrap it once, around the loop, with ``run_failed``)."""
    try:
        return session.prepare(feeds)
    except RUN_ERRORS as error:
        raise run_failed(feeds, role, error) from error


def io_binding(session: Session) -> str:
    """How the session's prepared runs bind inputs and outputs (``details["io_binding"]``)."""
    return str(session.details.get("io_binding", "off"))


def dataset(ctx: EvalContext, name: str) -> Dataset:
    try:
        data = ctx.dataset(name)
    except KeyError as error:
        raise EvaluationError(str(error.args[0]) if error.args else f"unknown dataset '{name}'") from None
    if len(data) == 0:
        raise EvaluationError(f"dataset '{name}' holds no samples")
    return data


def select_feeds(specs: list[TensorSpec], batch: dict[str, np.ndarray], dataset_name: str, role: str = "model") -> dict[str, np.ndarray]:
    """The arrays of ``batch`` that ``specs`` declare, cast to the declared dtype when only the
    width differs (int64 token ids for an int32 input). Raises when an input is missing."""
    import numpy as np

    missing = [spec.name for spec in specs if spec.name not in batch]
    if missing:
        raise EvaluationError(
            f"dataset '{dataset_name}' lacks input(s) {', '.join(missing)} that the {role} needs "
            f"(dataset has: {', '.join(sorted(batch)) or 'nothing'}; {role} takes: {', '.join(spec.name for spec in specs)})"
        )
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        array = batch[spec.name]
        try:
            wanted = np.dtype(spec.dtype)
        except TypeError:  # a dtype numpy does not know (bfloat16): let the runtime judge
            feeds[spec.name] = array
            continue
        if array.dtype != wanted and _same_family(array.dtype, wanted):
            array = array.astype(wanted)
        feeds[spec.name] = np.ascontiguousarray(array)
    return feeds


def _same_family(have: np.dtype, want: np.dtype) -> bool:
    integers = "iub"
    return (have.kind in integers and want.kind in integers) or (have.kind == "f" and want.kind == "f")


class FeedConfig(EvaluatorConfig):
    """Options of evaluators that feed a model one batch over and over (latency, memory)."""

    batch_size: int = Field(default=1, ge=1, description="Samples per inference.")
    sequence_length: int = Field(
        default=128,
        ge=1,
        description="Length of unnamed symbolic axes after the first (synthetic feeds only; a dataset brings its own).",
    )
    dims: dict[str, int] = Field(default_factory=dict, description="Lengths for named symbolic axes of the inputs (synthetic feeds only).")
    data: DatasetRef | None = Field(
        default=None,
        description="A dataset whose first batch_size samples are the feeds. Omit for random feeds made from the model's inputs.",
    )
    seed: int = Field(default=0, description="Seed of the random feeds.")
    int_high: int = Field(
        default=1000,
        ge=1,
        description="Random integer inputs (token ids) are drawn from [0, int_high): keep it at most the model's vocabulary size.",
    )


#: the environment variable that sets ``quiet_wait_s``'s default
QUIET_WAIT_ENV = "KILN_QUIET_WAIT_S"


def quiet_wait_default() -> float:
    """``quiet_wait_s`` when a workflow does not set it: ``$KILN_QUIET_WAIT_S`` where set (a shared CI
    runner that is never quiet: ``0`` keeps a busy measurement at once, flagged, instead of waiting
    for a quiet that does not come), else 30 s. Like every resolved option it is part of an
    evaluation's key: a timing that waited for quiet is not served for one that would not have."""
    raw = os.environ.get(QUIET_WAIT_ENV, "").strip()
    if not raw:
        return 30.0
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 86_400:
        problem = Problem(
            where=QUIET_WAIT_ENV,
            message="the environment variable is not a number of seconds",
            expected="seconds from 0 to 86400",
            given=repr(raw),
            hint=f"unset {QUIET_WAIT_ENV} (30 s) or set it to a number such as 0",
            file="<environment>",
        )
        raise InputError(problems=[problem])
    return seconds


class ComparisonRules(EvaluatorConfig):
    """Options every timing evaluator that compares a candidate with its reference shares (latency
    in rounds, throughput in windows, generation): when to stop, how sure to be, and the noise guard."""

    precision: float = Field(
        default=0.05,
        gt=0,
        lt=1,
        description="Stop adding measurements once the speedup's confidence interval is within ± this fraction of the speedup (0.05 = ±5%).",
    )
    confidence: float = Field(default=0.95, gt=0, lt=1, description="Confidence of the interval the stopping rule uses.")
    stop_when_slower: bool = Field(
        default=True,
        description=(
            "Stop adding measurements once the whole interval of the speedup is below 1: the candidate is slower than the model it is "
            "compared with (its target's reference, or the other side of a runoff), so it cannot win against it and a tighter "
            "interval would decide nothing: once `sessions` and the least rounds are measured, even before the `runs` asked. "
            "false: measure until `precision` (or the budget) whatever the side."
        ),
    )
    stop_when_faster_than: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        description=(
            "Stop adding measurements once the whole interval of the speedup is above this ratio: the candidate is faster than "
            "the model compared with by more than that, beyond doubt. Unset: measure until `precision` (or the budget). Where "
            "the selection runs ties off (`select.runoff`, the default) and no constraint names the evaluation, the engine "
            "sets it on the candidates' timing of the objective (to 1 + `select.tie_within`, or 1) and on a runoff (to 1): "
            "each is measured until its question is decided, and the runoff, pairing the tied leaders with each other, ranks them."
        ),
    )
    stop_when_within: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description=(
            "Stop adding measurements once the whole interval of the speedup lies within this margin of 1 (between "
            "1 / (1 + margin) and 1 + margin): the candidate is as fast as the model compared with, within a difference the "
            "workflow calls immaterial. Unset: measure until `precision` (or the budget). Where the selection runs ties off "
            "and sets `stop_when_faster_than` on the candidates' timing, the engine sets this to `select.tie_within` (when "
            "set): such a candidate is equivalent to its reference, and the selection counts their estimates as equal."
        ),
    )
    max_time_s: float = Field(
        default=60.0, gt=0, le=86_400, description="Time budget for the measurements: stop adding them after this many seconds."
    )
    busy_cores: float = Field(
        default=0.3,
        gt=0,
        le=4096,
        description=(
            "Other processes (and hypervisor steal) using more than this many cores during a measurement (a round of both "
            "models) make it busy: thrown away and re-measured once quiet."
        ),
    )
    quiet_wait_s: float = Field(
        default_factory=quiet_wait_default,
        ge=0,
        le=86_400,
        description=(
            "Seconds, in all, to spend waiting for a busy machine to become quiet; after that busy measurements are kept and flagged. "
            "Default 30, or $KILN_QUIET_WAIT_S where set."
        ),
    )


def decided_against_compared(stop_when_slower: bool, threshold: float | None, interval: Interval, within: float | None = None) -> str:
    """Why the comparison is decided (``ComparisonRules.stop_when_slower``, ``stop_when_faster_than``:
    ``threshold``, ``stop_when_within``: ``within``), or ""."""
    slower = slower_than_compared(stop_when_slower, interval)
    if slower:
        return slower
    if threshold is not None and interval.low > threshold:
        return f"faster than the model compared with by more than {threshold:g}x (the whole interval above it: {interval.low:.3g}-{interval.high:.3g})"
    if within is not None and interval.within_ratio(within):
        return (
            f"as fast as the model compared with, within {within:.0%} (the whole interval inside "
            f"{1 / (1 + within):.3g}-{1 + within:.3g}: {interval.low:.3g}-{interval.high:.3g})"
        )
    return ""


def slower_than_compared(stop_when_slower: bool, interval: Interval) -> str:
    """``ComparisonRules.stop_when_slower``'s reason to stop, or "" (the rule is off, or the interval reaches 1)."""
    if not stop_when_slower or interval.high >= 1:
        return ""
    return f"slower than the model compared with (the whole interval below 1: {interval.low:.3g}-{interval.high:.3g})"


class ComparedTimingConfig(ComparisonRules, FeedConfig):
    """The options of the timing evaluators that feed one batch (latency, throughput) and compare."""


def dataset_batch(ctx: EvalContext, cfg: FeedConfig) -> dict[str, np.ndarray] | None:
    """The first ``batch_size`` samples of the configured dataset (copies, so the rest can be
    freed), or None for synthetic feeds."""
    if cfg.data is None:
        return None
    data = dataset(ctx, cfg.data)
    if len(data) < cfg.batch_size:
        raise EvaluationError(f"dataset '{cfg.data}' has {len(data)} samples, fewer than batch_size={cfg.batch_size}")
    return {name: array.copy() for name, array in next(data.batches(cfg.batch_size, limit=cfg.batch_size)).items()}


def feeds_for(session: Session, cfg: FeedConfig, batch: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """The session's feeds: from ``batch`` when there is one, else synthetic from its inputs."""
    from engine.core.data import synthetic_feeds  # brings numpy in

    # a decoder's run is one forward pass of input_ids (and attention_mask) from an empty cache:
    # its cache inputs are never fed, so none is made
    specs = session.token_inputs if isinstance(session, GenerativeSession) else session.inputs
    if batch is None:
        return synthetic_feeds(specs, cfg.batch_size, cfg.sequence_length, seed=cfg.seed, dims=cfg.dims, int_high=cfg.int_high)
    assert cfg.data is not None
    return select_feeds(specs, batch, cfg.data)
