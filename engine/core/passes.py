"""The pass SDK: a pass is a small class with metadata, a typed ``Config`` and a ``run``.

The base class owns the contract around ``run`` (check the input format, run, check the
output, wrap failures in ``PassError``), so a subclass writes only ``run`` and, when its output
format has a stronger check than "the file exists", ``check_output``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from engine.core.artifact import ModelArtifact
from engine.core.config import EnvironmentSpec, StrictConfig
from engine.core.errors import KilnError, MissingDependency, PassError
from engine.core.search import Distribution

if TYPE_CHECKING:
    from engine.core.data import Dataset
    from engine.core.evaluator import MetricResult
    from engine.core.target import Target, TensorSpec


class PassConfig(StrictConfig):
    """Base of every pass's ``Config``."""


@dataclass
class PassContext:
    """What a running pass may touch.

    A pass reads its input, writes its model only into ``output_dir`` and scratch files only into
    ``workdir`` (the process's working directory while it runs); it never prints and never
    reaches the network.
    """

    step_id: str
    workdir: Path
    output_dir: Path
    #: the target the job runs for: given to a target-dependent pass, and to a pass whose output
    #: depends on part of its target (``Pass.target_facet`` not None; a job shared by several
    #: targets gets the first); None for the others
    target: Target | None = None
    input_model: ModelArtifact | None = None
    datasets: dict[str, Callable[..., Dataset]] = field(default_factory=dict)  # name -> loader(signature=None)
    #: a folder shared by every run of this pass (across candidates and runs) for results the
    #: pass keys itself by content, e.g. calibration ranges keyed by model + data + method
    cache_dir: Path | None = None
    #: measure a model with one of the workflow's evaluators, by evaluation id (``fidelity``):
    #: ``ctx.measure("fidelity", model)`` -> MetricResult, on ``target`` against the reference.
    #: Given by the engine to passes that have an ``EvaluationRef`` option.
    measure: Callable[[str, ModelArtifact], MetricResult] | None = None
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("kiln.pass"))

    def dataset(self, name: str, signature: list[TensorSpec] | None = None) -> Dataset:
        """The named dataset. ``signature`` (the model's inputs) lets a pass with no target read
        a synthetic dataset, which is built from the consuming model's inputs."""
        try:
            loader = self.datasets[name]
        except KeyError:
            known = ", ".join(sorted(self.datasets)) or "none"
            raise KilnError(
                f"step '{self.step_id}' asked for dataset '{name}', which the workflow does not declare (declared: {known})"
            ) from None
        return loader(signature) if signature is not None else loader()


@dataclass
class PassResult:
    """The output model plus what the pass did to it, in figures a report can show."""

    model: ModelArtifact
    details: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class Pass(ABC):
    """One transformation of a model. Subclasses set the class attributes and write ``run``."""

    name: ClassVar[str]
    summary: ClassVar[str]
    version: ClassVar[str] = "1"
    accepts: ClassVar[tuple[str, ...]]
    produces: ClassVar[str]
    #: formats of ``accepts`` the pass passes through: an input in one of them gives an output
    #: in the same format (a ``genai`` decoder folder through an ONNX pass stays a ``genai``
    #: folder); any other input gives ``produces``. See ``output_format``.
    keeps: ClassVar[tuple[str, ...]] = ()
    target_dependent: ClassVar[bool] = False
    #: the kinds of Hugging Face model the pass can take (``engine.core.model_kind``: "decoder",
    #: "encoder-decoder", "encoder"); empty: any. ``engine validate`` refuses the others
    model_kinds: ClassVar[tuple[str, ...]] = ()
    #: distributions whose versions change what the pass writes: they enter every job key
    libraries: ClassVar[tuple[str, ...]] = ()
    Config: ClassVar[type[PassConfig]] = PassConfig
    #: options worth searching, with their default search distributions
    search_space: ClassVar[dict[str, Distribution]] = {}
    # What options refer to (a dataset, an evaluation, a file, a value of the input model, the
    # input's task) is said by their types in ``Config``: see ``engine.core.refs``.
    #: how long a job of this pass may run when its step sets no ``timeout_s`` (generous: a
    #: hanging runtime must not block a run forever, a slow export must not fail)
    default_timeout_s: ClassVar[float] = 7200.0
    #: the isolated environment the pass runs in when its step names none (a library that cannot
    #: share the main environment: old numpy / onnx pins): built once by ``engine run`` from these
    #: pinned requirements (engine.execute.environments); a step's own ``environment`` replaces it
    environment: ClassVar[EnvironmentSpec | None] = None

    @classmethod
    def warm_modules(cls, input_format: str) -> tuple[str, ...]:
        """What a warm worker imports ahead of this pass's jobs, in order: distribution names (their
        top-level module) or dotted module names (slow submodules a library loads only when first
        used). ``input_format``: the format of the workflow's input model. Default: ``libraries``."""
        return cls.libraries

    @classmethod
    def target_facet(cls, config: dict[str, Any], target_fingerprint: dict[str, Any] | None) -> dict[str, Any] | None:
        """What of the target this pass's output depends on, with ``config`` (the job's full
        config), planned for the target with ``target_fingerprint`` (None: planned for none).

        The job key names the facet, not the target: targets with the same facet share one job,
        and a pass that returns a facet is given the target at run time (``PassContext.target``).
        None: the output does not depend on the target (no target at run time, one job for all
        targets). The default is the whole fingerprint for a ``target_dependent`` pass, else None.
        A pass returns None for the targets its output was always made for (the CPU, for most
        ONNX passes), so the keys of those jobs stay what they were before the pass looked at
        its target."""
        return target_fingerprint if cls.target_dependent else None

    @classmethod
    def resolve_for_target(cls, config: dict[str, Any], target_fingerprint: dict[str, Any] | None) -> dict[str, Any]:
        """``config`` with the options it leaves to the target (null = "from the target") set to
        the value the target gives them: the config the job runs with and its key names. The
        default changes nothing."""
        return config

    @classmethod
    def output_format(cls, input_format: str) -> str:
        """The format the pass writes for an input in ``input_format``: the input's own when the
        pass ``keeps`` it, else ``produces``. Everything that reasons about what a step hands on
        (workflow validation, the planner, the output check) asks this, not ``produces``."""
        return input_format if input_format in cls.keeps else cls.produces

    def __init__(self, config: PassConfig | None = None) -> None:
        self.config = config if config is not None else self.Config()

    @abstractmethod
    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        """Transform ``model``; write the result into ``ctx.output_dir``."""

    def check_output(self, result: PassResult, ctx: PassContext) -> None:
        """Raise if the output is not a usable model of a format the pass declares (``produces`` or
        one it ``keeps``; the call checks it is the one for its input). Formats add stronger checks."""
        if result.model.format != self.produces and result.model.format not in self.keeps:
            raise ValueError(f"declared to produce {self.produces!r} but produced {result.model.format!r}")
        if not result.model.model_file.exists():
            raise ValueError(f"the output model file {result.model.model_file.name} was not written")

    def __call__(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        if model.format not in self.accepts:
            raise PassError(self.name, ctx.step_id, model.digest, f"accepts {', '.join(self.accepts)} models, got a {model.format} model")
        try:
            result = self.run(model, ctx)
            expected = self.output_format(model.format)
            if result.model.format != expected:
                raise ValueError(f"declared to produce {expected!r} from a {model.format!r} model but produced {result.model.format!r}")
            self.check_output(result, ctx)
        except (PassError, MissingDependency):
            raise
        except KilnError as error:
            raise PassError(self.name, ctx.step_id, model.digest, str(error)) from error
        except Exception as error:
            raise PassError(self.name, ctx.step_id, model.digest, f"{type(error).__name__}: {error}") from error
        return result

    @classmethod
    def describe(cls) -> dict[str, Any]:
        """Metadata and the config schema, for ``engine passes NAME`` and the docs."""
        return {
            "name": cls.name,
            "version": cls.version,
            "summary": cls.summary,
            "accepts": list(cls.accepts),
            "produces": cls.produces,
            "keeps": list(cls.keeps),
            "target_dependent": cls.target_dependent,
            "libraries": list(cls.libraries),
            "environment": list(cls.environment.requirements) if cls.environment is not None else None,
            "config_schema": cls.Config.model_json_schema(),
            "search_space": {k: v.to_json() for k, v in cls.search_space.items()},
        }
