"""The evaluator SDK: measure one candidate on one target, return named figures."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from engine.core.config import StrictConfig
from engine.core.stats import Statistic

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact
    from engine.core.data import Dataset
    from engine.core.target import Target


class EvaluatorConfig(StrictConfig):
    """Base of every evaluator's ``Config``."""


@dataclass
class EvalContext:
    target: Target
    workdir: Path
    #: the unoptimized model on the same target; None when evaluating the reference itself
    reference: ModelArtifact | None = None
    datasets: dict[str, Callable[[], Dataset]] = field(default_factory=dict)
    #: a folder shared by every evaluation of this evaluator (across candidates and runs) for
    #: results it keys itself by content, e.g. the reference's outputs on a dataset
    cache_dir: Path | None = None
    #: the target the reference runs on: the target as the workflow writes it, where ``target``
    #: carries a candidate's searched session settings (threads, provider options, ...); None
    #: means ``target``. Evaluators that open the reference open it here, so a speedup includes
    #: what the candidate's settings gain over the reference's.
    reference_target: Target | None = None

    @property
    def reference_on(self) -> Target:
        """Where the reference runs (``reference_target``, else ``target``)."""
        return self.reference_target if self.reference_target is not None else self.target

    def dataset(self, name: str) -> Dataset:
        try:
            return self.datasets[name]()
        except KeyError:
            known = ", ".join(sorted(self.datasets)) or "none"
            raise KeyError(f"dataset '{name}' is not declared in the workflow (declared: {known})") from None


@dataclass(frozen=True)
class Samples:
    """The per-sample figures behind one metric: the metric is ``statistic`` of ``values``
    (the mean of per-sentence cosines, the median of per-round speedups). The engine bootstraps
    an interval from them at the workflow's confidence, so constraints and ties are judged on
    what the samples can support, not on one point estimate."""

    statistic: Statistic
    values: list[float]
    #: which values share a group (e.g. the pair of sessions a timing round ran on): the engine
    #: then resamples groups, not just values (a clustered bootstrap). None: independent values.
    groups: list[int] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"statistic": self.statistic, "values": self.values}
        if self.groups is not None:
            out["groups"] = self.groups
        return out


@dataclass
class MetricResult:
    """Figures named ``<metric>_<unit>`` (``p50_ms``, ``cosine_mean``) plus how they were taken,
    and for metrics that summarise samples, the samples (see ``Samples``)."""

    values: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)
    samples: dict[str, Samples] = field(default_factory=dict)


class Evaluator(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]
    version: ClassVar[str] = "1"
    Config: ClassVar[type[EvaluatorConfig]] = EvaluatorConfig
    #: the figures ``evaluate`` returns; checked against ``select`` when a workflow is validated
    metrics: ClassVar[tuple[str, ...]] = ()
    #: timing evaluators belong to the host they ran on and never share the machine with other work
    timing: ClassVar[bool] = False
    #: its sessions are opened as the chosen model is deployed (the target as written), since its
    #: figures describe a session (timing evaluators, memory); otherwise on ``Target.untimed``:
    #: the same outputs, opened to share the cores with other jobs
    deployed_sessions: ClassVar[bool] = False
    #: opens the model in a session on the target (so a model the target cannot load fails it);
    #: where no evaluation of a workflow does, the engine adds ``load``, which does only that
    opens_session: ClassVar[bool] = True
    #: compares against the reference model (so the reference digest enters the key)
    needs_reference: ClassVar[bool] = False
    libraries: ClassVar[tuple[str, ...]] = ()
    #: the option (an int, or None for every row) that scores only the first N rows of its dataset:
    #: the engine then judges a constraint on this evaluation's metrics on a few rows first and on
    #: every row only when the few cannot decide (engine.execute.stages); None: always every row
    stage_option: ClassVar[str | None] = None
    #: rows the first look scores (a cheap row, such as a sentence's embedding, affords more)
    stage_rows: ClassVar[int] = 8
    #: metrics better ranked through a paired figure measured against the reference in the same
    #: evaluation, ``{metric: paired metric}``; the paired metric is higher-is-better (latency:
    #: ``p50_ms`` is ranked by ``speedup``, the reference's time over the candidate's, round by round)
    paired_metrics: ClassVar[dict[str, str]] = {}
    # Options naming a dataset (``DatasetRef``) or a file (``FilePath``: made absolute against the
    # workflow's folder, checked to exist, hashed by content into every evaluation key; ``CodePath``:
    # a Python file whose code runs, listed by `engine validate`) are typed: see ``engine.core.refs``.
    #: how long one evaluation may run when the workflow sets no ``timeout_s``
    default_timeout_s: ClassVar[float] = 3600.0

    def __init__(self, config: EvaluatorConfig | None = None) -> None:
        self.config = config if config is not None else self.Config()

    @abstractmethod
    def evaluate(self, model: ModelArtifact, ctx: EvalContext) -> MetricResult:
        """Measure ``model`` on ``ctx.target``."""

    @classmethod
    def describe(cls) -> dict[str, Any]:
        return {
            "name": cls.name,
            "version": cls.version,
            "summary": cls.summary,
            "metrics": list(cls.metrics),
            "timing": cls.timing,
            "config_schema": cls.Config.model_json_schema(),
        }
