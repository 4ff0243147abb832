"""Drive ``nncf.quantize_with_accuracy_control`` with one of the workflow's evaluators as its
validation function.

NNCF hands its validation function a model compiled by itself (``ov.CompiledModel``), which
cannot be written back as IR for an evaluator to open. So while NNCF runs, its ``Evaluator``
prepares models as ``Candidate`` objects holding the ``ov.Model`` itself, and ``Validator``
(the validation function) writes each candidate into the workdir as an ``openvino`` artifact and
measures it with ``ctx.measure`` — on the pass's target, against the pass's input model. Values
are cached by artifact digest: NNCF validates the same model several times.

The evaluator reads its own dataset: the items NNCF passes are only counted (NNCF needs as many
per-item values as items). NNCF's own per-item logits mode is never used, and the ranking runs
in one worker (``num_ranking_workers=1``) since measurements must not overlap.

Imported by ``nncf_quantize_accuracy`` only when it runs: it imports openvino and nncf.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openvino as ov
from nncf.quantization.algorithms.accuracy_control.backend import PreparedModel
from nncf.quantization.algorithms.accuracy_control.evaluator import Evaluator

from engine.core import KilnError, ModelArtifact
from engine.core.evaluator import MetricResult
from passes.openvino import _ir


class Candidate(PreparedModel):
    """A model NNCF wants validated, passed to the validation function as it is."""

    def __init__(self, model: ov.Model) -> None:
        self.model = model

    @property
    def model_for_inference(self) -> Candidate:
        return self

    @property
    def engine(self) -> Any:
        raise KilnError("NNCF asked for raw model outputs (its logits mode); this pass validates only with a metric")


@contextlib.contextmanager
def candidates_as_models() -> Iterator[None]:
    """While the block runs, NNCF's Evaluator prepares ``Candidate`` objects instead of compiling."""
    original = Evaluator.prepare_model

    def prepare_model(self: Evaluator, model: Any) -> Candidate:
        return Candidate(model)

    Evaluator.prepare_model = prepare_model  # type: ignore[method-assign]
    try:
        yield
    finally:
        Evaluator.prepare_model = original  # type: ignore[method-assign]


@dataclass
class Measured:
    digest: str
    value: float
    #: names of the ops a FakeQuantize feeds: the quantized ops
    quantized_ops: set[str]


@dataclass
class Validator:
    """NNCF's validation function: write the candidate, measure it, return (metric, per item)."""

    measure: Callable[[str, ModelArtifact], MetricResult]
    evaluation: str
    metric: str
    goal: str  # "max" or "min" (higher / lower is better)
    workdir: Path
    hint: str | None
    attrs: dict[str, Any]
    #: every distinct model measured, in order: the first is the input, the second the fully
    #: quantized model NNCF starts restoring from
    measured: list[Measured] = field(default_factory=list)
    calls: int = 0
    error: BaseException | None = None
    _cache: dict[str, float] = field(default_factory=dict)

    def __call__(self, model: Any, items: Iterable[Any]) -> tuple[float, list[float]]:
        count = sum(1 for _ in items)  # NNCF counts the items it hands over
        self.calls += 1
        try:
            if not isinstance(model, Candidate):
                raise KilnError(f"NNCF passed a {type(model).__name__} to the validation function, not the model it prepared")
            value = self._value(model.model)
        except BaseException as error:
            # NNCF takes an exception in its first call as "use logits mode": keep the real cause
            self.error = self.error or error
            raise
        if self.goal == "min":
            # NNCF wants higher = better and computes a relative drop (dividing by the initial
            # value) even when asked for the absolute one: pass 1 + initial - value, which keeps
            # absolute drops and is 1 for the input model (never 0)
            value = 1.0 + self.measured[0].value - value
        return value, [value] * count

    def _value(self, model: ov.Model) -> float:
        folder = self.workdir / "candidate"
        shutil.rmtree(folder, ignore_errors=True)
        _ir.save_ir(model.clone(), folder, self.hint)  # a copy: NNCF finds nodes by the names save_ir rewrites
        artifact = ModelArtifact.from_folder("openvino", folder, attrs=self.attrs)
        if artifact.digest in self._cache:
            return self._cache[artifact.digest]
        value = self.measure_value(artifact)
        self._cache[artifact.digest] = value
        self.measured.append(Measured(artifact.digest, value, set(_ir.quantized_op_names(model))))
        return value

    def measure_value(self, artifact: ModelArtifact) -> float:
        result = self.measure(self.evaluation, artifact)
        if self.metric not in result.values:
            raise KilnError(
                f"evaluation '{self.evaluation}' reports no value '{self.metric}' (option metric); it reports: {', '.join(sorted(result.values))}"
            )
        return float(result.values[self.metric])


_ITERATION = re.compile(r"^Reverted \d+ operations")
_SUMMARY = ("Accuracy drop", "Algorithm completed", "could not achieve", "Maximum number of iteration")


def nncf_report(messages: list[str]) -> dict[str, Any]:
    """What NNCF's INFO log says about the restoration: how many iterations, and its summary."""
    return {
        "iterations": sum(1 for m in messages if _ITERATION.match(m)),
        "log": [m.splitlines()[0][:300] for m in messages if any(key in m for key in _SUMMARY)],
    }
