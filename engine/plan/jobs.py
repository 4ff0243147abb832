"""Typed jobs: what the planner decides once per job, and what a worker process is sent.

A ``PassSpec`` is made by the planner for each pass job: the pass and its config, the job it
reads its model from, the datasets and workflow evaluations it uses, the target's fingerprint
(or, for a pass that is not target-dependent, the facet of the target its output depends on).
The job's key (engine.plan.keys) is computed from it alone. An ``EvalSpec`` is the same for one of
the workflow's evaluations. A ``WorkOrder`` is what one worker runs; ``to_json``/``from_json``
are the only place an order becomes the job file and back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine import registry
from engine.core.artifact import ModelArtifact
from engine.core.hashing import sha256_json
from engine.core.refs import RefKind, referenced, references
from engine.plan import keys
from engine.workflow.resolve import EvaluatorEntry, ResolvedWorkflow, Step
from engine.workflow.resolve.model import BuiltEnvironment

Key = tuple[str, dict[str, Any]]  # a key and the document it is the digest of


def named_options(cls: Any, config: dict[str, Any], kind: RefKind) -> tuple[str, ...]:
    """The names a config gives in the options its plugin types as references of ``kind``."""
    return tuple(referenced(cls.Config, config, kind).values())


@dataclass(frozen=True)
class MeasuringEvaluation:
    """A workflow evaluation a pass measures with (``ctx.measure``)."""

    plugin: str
    version: str
    config: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"plugin": self.plugin, "version": self.version, "config": self.config}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MeasuringEvaluation:
        return cls(plugin=data["plugin"], version=data.get("version", ""), config=data["config"])


@dataclass(frozen=True)
class TargetRef:
    """How a worker builds the target: its runtime and config."""

    runtime: str
    config: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "config": self.config}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TargetRef:
        return cls(runtime=data["runtime"], config=data["config"])


@dataclass(frozen=True)
class DatasetInput:
    """Where a worker reads a dataset: the stored file, or its source (built from a signature)."""

    path: str | None = None
    source: str | None = None
    config: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path} if self.path is not None else {"source": self.source, "config": self.config}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DatasetInput:
        if "path" in data:
            return cls(path=data["path"])
        return cls(source=data["source"], config=data["config"])


def target_ref(resolved: ResolvedWorkflow, target_id: str, settings: dict[str, Any] | None = None) -> TargetRef:
    """The target as a worker builds it, running with ``settings`` (its searched session
    settings by dotted name; none: as the workflow writes it)."""
    entry = resolved.targets[target_id]
    return TargetRef(runtime=entry.cls.runtime, config=entry.variant(settings or {}).config.to_json())


def target_environment(resolved: ResolvedWorkflow, target_id: str) -> BuiltEnvironment | None:
    """The built environment the target lives in (None: the engine's own)."""
    environment = getattr(resolved.targets[target_id].instance.config, "environment", None)
    return resolved.environments.get(environment.key()) if environment is not None else None


def target_python(resolved: ResolvedWorkflow, target_id: str) -> str | None:
    """The interpreter of the environment the target lives in (None: the engine's own)."""
    built = target_environment(resolved, target_id)
    return built.python if built is not None else None


def environment_json(built: BuiltEnvironment | None) -> dict[str, Any] | None:
    """A built environment as a job file carries it: what a node needs to find or build the same
    one (requirements, key) and to check it froze alike (the driver's package hash and versions)."""
    if built is None:
        return None
    return {
        "key": built.key,
        "requirements": list(built.requirements),
        "python": built.python,
        "packages": built.packages,
        "versions": dict(built.versions),
    }


def environment_from_json(data: dict[str, Any] | None) -> BuiltEnvironment | None:
    """``environment_json`` read back."""
    if not data:
        return None
    return BuiltEnvironment(
        key=data["key"],
        requirements=tuple(data["requirements"]),
        python=data["python"],
        packages=data["packages"],
        versions=tuple(sorted((data.get("versions") or {}).items())),
    )


def _step_environment(resolved: ResolvedWorkflow, step: Step) -> tuple[dict[str, Any] | None, BuiltEnvironment | None]:
    """What a step's own environment (or its pass's) adds to its key (its requirements and, once
    built, the hash of its frozen package list), and the built environment."""
    if step.environment is None:
        return None, None
    built = resolved.environments.get(step.environment.key())
    return {"requirements": list(step.environment.requirements), "packages": built.packages if built else None}, built


def _step_libraries(step: Step, built: BuiltEnvironment | None) -> dict[str, str | None] | None:
    """The versions of the pass's libraries its jobs run with, when they run in an environment:
    the environment's (None each while it is not built); None: the main environment's."""
    if step.environment is None:
        return None
    libraries = step.pass_cls.libraries
    return built.library_versions(libraries) if built is not None else dict.fromkeys(libraries)


@dataclass(frozen=True)
class EvalSpec:
    """One of the workflow's evaluations, with the datasets and files its key names."""

    id: str
    plugin: str
    evaluator_cls: Any = field(repr=False, compare=False)
    config: dict[str, Any] = field(compare=False)
    datasets: tuple[str, ...] = ()
    files: tuple[tuple[str, Path], ...] = ()  # (option, path) of each file it reads
    timeout_s: float | None = None
    candidates: bool = True
    #: the evaluation as the workflow wrote it, where the engine asks less of it (a timing measured
    #: to its decision: engine.execute.evaluation.to_the_decision); its record answers this one too,
    #: so the store is asked for it first
    as_written: EvalSpec | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, entry: EvaluatorEntry) -> EvalSpec:
        files = tuple((o, Path(path)) for o, path in referenced(entry.cls.Config, entry.config, RefKind.FILE).items())
        return cls(
            id=entry.id,
            plugin=entry.name,
            evaluator_cls=entry.cls,
            config=entry.config,
            datasets=named_options(entry.cls, entry.config, RefKind.DATASET),
            files=files,
            timeout_s=entry.timeout_s or entry.cls.default_timeout_s,
            candidates=entry.candidates,
        )

    @property
    def timing(self) -> bool:
        return bool(self.evaluator_cls.timing)

    @property
    def needs_reference(self) -> bool:
        return bool(self.evaluator_cls.needs_reference)

    def key(
        self,
        model_digest: str,
        reference_digest: str | None,
        target_fingerprint: dict[str, Any],
        dataset_keys: dict[str, str],
        file_digest: Callable[[Path], str],
        reference_target: dict[str, Any] | None = None,
    ) -> Key:
        """Its key on a model: the datasets it reads by key, the files it names by content, and
        the target the reference ran on when it is not the candidate's (``reference_target``)."""
        data = {name: dataset_keys[name] for name in self.datasets}
        data.update({f"file:{option}": file_digest(path) for option, path in self.files})
        if reference_target is not None:
            data["reference target"] = sha256_json(reference_target)
        return keys.eval_key(self.evaluator_cls, self.config, model_digest, reference_digest, target_fingerprint, data)


@dataclass(frozen=True)
class PassSpec:
    """One pass job, decided once by the planner."""

    job_id: str
    step_id: str
    label: str
    pass_name: str
    pass_cls: Any = field(repr=False, compare=False)
    config: dict[str, Any] = field(compare=False)
    parent: str | None = None  # the job whose output it reads; None: the workflow's input model
    target: TargetRef | None = None  # set for a target-dependent pass, and for a pass with a target facet
    target_fingerprint: dict[str, Any] | None = field(default=None, compare=False)  # a target-dependent pass's
    target_facet: dict[str, Any] | None = field(default=None, compare=False)  # another pass's (Pass.target_facet)
    datasets: tuple[str, ...] = ()  # its own and those of the evaluations it measures with
    evaluations: dict[str, MeasuringEvaluation] = field(default_factory=dict, compare=False)
    timeout_s: float | None = None
    #: the step's own environment as its key names it (None: the step declares none)
    environment: dict[str, Any] | None = field(default=None, compare=False)
    #: the interpreter its worker runs with: the step's environment's, else its target's (None: the engine's)
    python: str | None = field(default=None, compare=False)
    #: the built environment that interpreter belongs to (a node without it builds the same one)
    runs_in: BuiltEnvironment | None = field(default=None, compare=False)
    #: the versions of the pass's libraries in the step's environment (None: the main environment's)
    libraries: dict[str, str | None] | None = field(default=None, compare=False)

    def key(self, input_digest: str, dataset_keys: dict[str, str], workflow_input: str) -> Key:
        data = {name: dataset_keys[name] for name in self.datasets}
        if RefKind.INPUT_MODEL in references(self.pass_cls.Config):
            data["workflow input"] = workflow_input
        evaluations = {eval_id: ref.to_json() for eval_id, ref in self.evaluations.items()}
        return keys.pass_key(
            self.pass_cls,
            self.config,
            input_digest,
            data,
            self.target_fingerprint,
            evaluations,
            self.environment,
            facet=self.target_facet,
            libraries=self.libraries,
            builtin=registry.is_builtin("passes", self.pass_cls),
        )


def pass_spec(
    resolved: ResolvedWorkflow,
    job_id: str,
    step: Step,
    label: str,
    config: dict[str, Any],
    parent: str | None,
    target: str | None,
    fingerprint: dict[str, Any] | None,
    facet: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
) -> PassSpec:
    """``target``: the target the job runs for (a target-dependent pass's, or the first target of
    a job shared by its facet); ``fingerprint``: what a target-dependent pass's key names;
    ``facet``: what another pass's key names."""
    cls = step.pass_cls
    datasets = list(named_options(cls, config, RefKind.DATASET))
    evaluations = {}
    for eval_id in named_options(cls, config, RefKind.EVALUATION):
        entry = resolved.evaluators[eval_id]
        evaluations[eval_id] = MeasuringEvaluation(plugin=entry.name, version=entry.cls.version, config=entry.config)
        datasets += [n for n in named_options(entry.cls, entry.config, RefKind.DATASET) if n not in datasets]
    environment, built = _step_environment(resolved, step)
    runs_in = built if built is not None else (target_environment(resolved, target) if target else None)
    return PassSpec(
        job_id=job_id,
        step_id=step.id,
        label=label,
        pass_name=step.pass_name,
        pass_cls=cls,
        config=config,
        parent=parent,
        target=target_ref(resolved, target, settings) if target else None,
        target_fingerprint=fingerprint,
        target_facet=facet,
        datasets=tuple(dict.fromkeys(datasets)),
        evaluations=evaluations,
        timeout_s=step.timeout_s or cls.default_timeout_s,
        environment=environment,
        python=runs_in.python if runs_in is not None else None,
        runs_in=runs_in,
        libraries=_step_libraries(step, built),
    )


def _artifact(data: dict[str, Any] | None) -> ModelArtifact | None:
    return ModelArtifact.from_json(data) if data else None


def _json(artifact: ModelArtifact | None) -> dict[str, Any] | None:
    return artifact.to_json() if artifact is not None else None


@dataclass(frozen=True)
class WorkOrder:
    """What one worker runs: a pass, an evaluation or a dataset read."""

    kind: str  # pass | eval | dataset
    key: str
    key_doc: dict[str, Any]
    plugin: str
    config: dict[str, Any]
    step_id: str | None = None
    model: ModelArtifact | None = None
    reference: ModelArtifact | None = None
    input_model: ModelArtifact | None = None
    target: TargetRef | None = None
    #: where an evaluation opens the reference model, when not on ``target`` (a candidate that
    #: runs with searched session settings is compared with the reference on the target as written)
    reference_target: TargetRef | None = None
    datasets: dict[str, DatasetInput] = field(default_factory=dict)
    evaluations: dict[str, MeasuringEvaluation] = field(default_factory=dict)
    python: str | None = None  # the interpreter of the environment it runs in (None: the engine's)
    #: that environment as the driver built it: a node that lacks it builds the same one
    #: (engine.execute.node_env), so ``python`` is the driver's path, not necessarily the node's
    environment: BuiltEnvironment | None = None
    # where it runs, set by the executor
    store: str | None = None
    staging: str | None = None
    result: str | None = None

    def placed(self, store: Path, staging: Path) -> WorkOrder:
        return replace(self, store=str(store), staging=str(staging), result=str(staging / "result.json"))

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "key": self.key,
            "key_doc": self.key_doc,
            "plugin": self.plugin,
            "config": self.config,
            "step_id": self.step_id,
            "model": _json(self.model),
            "reference": _json(self.reference),
            "input_model": _json(self.input_model),
            "target": self.target.to_json() if self.target else None,
            "reference_target": self.reference_target.to_json() if self.reference_target else None,
            "datasets": {name: spec.to_json() for name, spec in self.datasets.items()},
            "evaluations": {eval_id: ref.to_json() for eval_id, ref in self.evaluations.items()},
            "python": self.python,
            "environment": environment_json(self.environment),
            "store": self.store,
            "staging": self.staging,
            "result": self.result,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkOrder:
        return cls(
            kind=data["kind"],
            key=data["key"],
            key_doc=data.get("key_doc") or {},
            plugin=data["plugin"],
            config=data.get("config") or {},
            step_id=data.get("step_id"),
            model=_artifact(data.get("model")),
            reference=_artifact(data.get("reference")),
            input_model=_artifact(data.get("input_model")),
            target=TargetRef.from_json(data["target"]) if data.get("target") else None,
            reference_target=TargetRef.from_json(data["reference_target"]) if data.get("reference_target") else None,
            datasets={name: DatasetInput.from_json(spec) for name, spec in (data.get("datasets") or {}).items()},
            evaluations={eval_id: MeasuringEvaluation.from_json(ref) for eval_id, ref in (data.get("evaluations") or {}).items()},
            python=data.get("python"),
            environment=environment_from_json(data.get("environment")),
            store=data.get("store"),
            staging=data.get("staging"),
            result=data.get("result"),
        )
