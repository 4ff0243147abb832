"""Custom: a metric computed by a function in a Python file the workflow names.

This runs code from that file in the worker process. The engine makes the file's path absolute,
checks it exists, and hashes its content into the evaluation key, so editing the file measures
again (modules the file imports are not hashed: bump ``options`` to force a re-run after editing
them). numpy is imported inside functions: the engine imports this module at validate time.
"""

from __future__ import annotations

import logging
import math
import numbers
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from engine.core.errors import EvaluationError, KilnError
from engine.core.evaluator import EvalContext, Evaluator, EvaluatorConfig, MetricResult
from engine.core.refs import CodePath, DatasetRef
from evaluators._sessions import dataset, open_session, run_session, select_feeds
from evaluators._usercode import describe_exception, load_function

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact
    from engine.core.target import Session, TensorSpec

logger = logging.getLogger(__name__)

_METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ModelRunner:
    """What the metric function receives as ``run``: call it with a dict of input arrays (extra
    keys are ignored, integer and float widths are cast to what the model declares) and get the
    outputs back as a dict by output name. ``inputs`` and ``outputs`` list the model's tensors
    (name, dtype, shape); ``calls`` counts the inferences so far."""

    def __init__(self, session: Session, dataset_name: str) -> None:
        self._session = session
        self._dataset_name = dataset_name
        self.inputs: list[TensorSpec] = list(session.inputs)
        self.outputs: list[TensorSpec] = list(session.outputs)
        self.calls = 0

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = run_session(self._session, select_feeds(self.inputs, feeds, self._dataset_name))
        self.calls += 1
        return {spec.name: array for spec, array in zip(self.outputs, arrays, strict=True)}


class Custom(Evaluator):
    """Calls ``function(run, data, **options)`` from ``file`` and returns what it returns.

    - ``run``: a :class:`ModelRunner` — ``run({"input": array}) -> {"output": array}`` — on the
      candidate model, opened on the evaluation's target;
    - ``data``: the dataset named by ``data`` (an ``engine.core.data.Dataset``: ``inputs``,
      ``labels``, ``meta``, ``batches(n)``), or None when ``data`` is omitted;
    - ``options``: the ``options`` mapping of the config, as keyword arguments.

    The function returns ``{metric_name: number}`` with exactly the names listed in ``metrics``
    (or a bare number when ``metrics`` lists one name). Since these names are the workflow's, the
    class declares no metric names (``metrics = ()``): constraints and objectives on
    ``<evaluation id>.<name>`` are checked against ``metrics`` when the function returns.
    """

    name = "custom"
    summary = "A metric computed by a function from a Python file the workflow names (runs code from that file)."
    version = "1"
    metrics = ()

    class Config(EvaluatorConfig):
        file: CodePath = Field(
            description="The Python file defining the metric function (its code runs in the worker); relative paths start at the workflow's folder."
        )
        function: str = Field(description="The function to call: function(run, data, **options) -> {metric: number}.")
        metrics: list[str] = Field(min_length=1, description="The names of the figures the function returns, e.g. [exact_match, bleu].")
        data: DatasetRef | None = Field(default=None, description="The dataset passed as `data`. Omit to pass None.")
        options: dict[str, Any] = Field(
            default_factory=dict, description="Keyword arguments passed to the function as they are (part of the evaluation key)."
        )

        @field_validator("metrics")
        @classmethod
        def _names(cls, names: list[str]) -> list[str]:
            bad = [name for name in names if not _METRIC_NAME.match(name)]
            if bad:
                raise ValueError(
                    f"metric names are letters, digits and underscores, not starting with a digit: {', '.join(map(repr, bad))}"
                )
            if len(set(names)) != len(names):
                raise ValueError("metric names must be distinct")
            return names

    config: Config

    def evaluate(self, model: ModelArtifact, ctx: EvalContext) -> MetricResult:
        cfg = self.config
        function = load_function(cfg.file, cfg.function, "file")
        data = dataset(ctx, cfg.data) if cfg.data is not None else None
        session = open_session(ctx, model)
        try:
            runner = ModelRunner(session, cfg.data or "(none)")
            try:
                returned = function(runner, data, **cfg.options)
            except KilnError as error:  # a session failure inside run(): already told in Kiln's words
                raise EvaluationError(f"{cfg.function} in {cfg.file} failed running the model: {error}") from error
            except Exception as error:  # the user's code: its failure is told with where it happened
                raise EvaluationError(f"{cfg.function} in {cfg.file} raised {describe_exception(error, Path(cfg.file))}") from error
        finally:
            session.close()
        values = self._check(returned)
        details: dict[str, Any] = {
            "file": cfg.file,
            "function": cfg.function,
            "data": cfg.data,
            "dataset_size": len(data) if data is not None else None,
            "options": dict(cfg.options),
            "inferences": runner.calls,
            "target": ctx.target.id,
        }
        logger.debug("custom %s of %s: %s", cfg.function, model.digest[:12], values)
        return MetricResult(values=values, details=details)

    def _check(self, returned: Any) -> dict[str, float]:
        cfg = self.config
        where = f"{cfg.function} in {cfg.file}"
        if not isinstance(returned, dict):
            if len(cfg.metrics) == 1 and _is_number(returned):
                returned = {cfg.metrics[0]: returned}
            else:
                what = "a number" if _is_number(returned) else type(returned).__name__
                raise EvaluationError(
                    f"{where} returned {what}; it must return a dict {{name: number}} with the names in `metrics` ({', '.join(cfg.metrics)})"
                )
        names = [str(key) for key in returned]
        missing = [name for name in cfg.metrics if name not in returned]
        extra = [name for name in names if name not in cfg.metrics]
        if missing or extra:
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + ([f"undeclared {', '.join(extra)}"] if extra else [])
            raise EvaluationError(
                f"{where} returned {', '.join(names) or 'no metric'} but `metrics` lists {', '.join(cfg.metrics)} ({'; '.join(parts)})"
            )
        values: dict[str, float] = {}
        for name in cfg.metrics:
            value = returned[name]
            if not _is_number(value) or math.isnan(float(value)):
                raise EvaluationError(f"{where} returned {value!r} for '{name}'; every metric must be a real number (not NaN, not a bool)")
            values[name] = float(value)
        return values


def _is_number(value: Any) -> bool:
    """A real number: int, float or a numpy scalar (a 0-d array too); never a bool."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return False
    if isinstance(value, numbers.Real):
        return True
    dtype = getattr(value, "dtype", None)
    return getattr(value, "shape", None) == () and dtype is not None and dtype.kind in ("i", "u", "f")
