"""Helpers the evaluators share: open and run sessions with failures told as ``EvaluationError``,
and pick from a dataset batch the feeds a session declares.

numpy is imported inside the functions: evaluator modules import this one at validate time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.core.errors import EvaluationError, KilnError, MissingDependency, TargetUnavailable

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact
    from engine.core.data import Dataset
    from engine.core.evaluator import EvalContext
    from engine.core.target import Session, TensorSpec


def open_session(ctx: EvalContext, model: ModelArtifact, role: str = "model") -> Session:
    """``ctx.target.open_session(model)``; a model the target cannot load becomes an
    EvaluationError (a missing library or an unavailable target keeps its own error)."""
    target = ctx.target
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


def run_session(session: Session, feeds: dict[str, np.ndarray], role: str = "model") -> list[np.ndarray]:
    try:
        return session.run(feeds)
    except EvaluationError:
        raise
    except KilnError as error:
        shapes = ", ".join(f"{name} {list(array.shape)} {array.dtype}" for name, array in feeds.items())
        raise EvaluationError(f"running the {role} failed on feeds ({shapes}): {error}") from error


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
