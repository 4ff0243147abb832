"""What resolving a workflow produces: plugins found, configs typed, paths absolute."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.config import EnvironmentSpec, StrictConfig, library_versions
from engine.core.search import SearchDim
from engine.core.target import Availability, Target
from engine.workflow.hub import HubModel
from engine.workflow.schema import Workflow

_MISSING = object()


@dataclass
class InputModel:
    format: str
    path: Path
    #: what steps read of it: ``task``; ``trust_remote_code`` (True, only when set); for a factory
    #: ``function`` and ``kwargs``; for a package ``package``; for a Hub model ``model`` (the repo
    #: id), ``revision`` (as asked) and ``commit`` (what it resolved to)
    attrs: dict[str, Any] = field(default_factory=dict)
    #: a Hugging Face Hub model: where the cache holds it, and whether it does yet (``path`` is
    #: its snapshot folder; ``engine run`` downloads what it lacks: ``fetch_input``)
    hub: HubModel | None = None
    #: the architecture of config.json that ``attrs["task"]`` was inferred from (no ``input.task``)
    inferred_task: str | None = None

    @property
    def digest_extra(self) -> dict[str, Any]:
        """What enters the input's digest besides its files: the commit a Hub model resolved to,
        and trust_remote_code when set (the folder's code then builds the model). Empty for any
        other input, whose digest is its files' alone."""
        extra: dict[str, Any] = {"commit": self.hub.commit} if self.hub is not None else {}
        if self.attrs.get("trust_remote_code"):
            extra["trust_remote_code"] = True
        return extra

    @property
    def files(self) -> tuple[str, ...] | None:
        """The files under ``path`` that make the model (a Hub snapshot's, those Kiln uses); None: all."""
        return self.hub.files if self.hub is not None else None

    @property
    def notes(self) -> list[str]:
        """What `engine validate` and `engine plan` tell about the input (a download to come)."""
        notes = [self.hub.note] if self.hub is not None and self.hub.note else []
        if self.inferred_task:
            notes.append(f"task: {self.attrs['task']} (inferred from config.json: architectures [{self.inferred_task}])")
        return notes


@dataclass
class Step:
    id: str
    pass_name: str
    pass_cls: Any
    config: dict[str, Any]  # validated, defaults included
    search: dict[str, SearchDim]
    after: str | None
    targets: list[str] | None
    optional: bool
    timeout_s: float | None
    #: options the workflow filled in, and from where (``{"task": "input.task"}``)
    filled: dict[str, str] = field(default_factory=dict)
    #: ``config`` as the pass's ``Config`` instance (``config`` is its JSON, what keys hash)
    typed_config: StrictConfig | None = None
    #: the virtual environment its pass runs in (engine.execute.environments), if any
    environment: EnvironmentSpec | None = None


@dataclass(frozen=True)
class BuiltEnvironment:
    """A built virtual environment jobs run in (made by engine.execute.environments)."""

    key: str
    requirements: tuple[str, ...]
    python: str  # its interpreter
    packages: str  # sha256 of its frozen package list
    #: the exact version of every package installed in it, by normalized name (from the frozen list)
    versions: tuple[tuple[str, str], ...] = ()

    def library_versions(self, names: tuple[str, ...] | list[str]) -> dict[str, str | None]:
        """Versions of ``names`` as a job there sees them: the environment's own, else the main
        environment's (it stays importable behind the environment's packages)."""
        from packaging.utils import canonicalize_name  # PEP 503, as the frozen list's names are (engine.execute.environments)

        own = dict(self.versions)
        main = library_versions([n for n in names if canonicalize_name(n) not in own])
        return {name: own.get(canonicalize_name(name), main.get(name)) for name in names}


@dataclass
class TargetEntry:
    id: str
    cls: Any
    instance: Target
    #: whether it can run here; None: asked of the target on first use (``availability``): a
    #: runtime's check imports it (openvino: 0.15 s), and `engine run` reads the workflow first
    #: thing, to tell its workers what to import
    checked: Availability | None = None
    #: the target's fingerprint measured inside its environment (None: ``instance.fingerprint()``)
    fingerprint: dict[str, Any] | None = None
    #: its searched session settings by dotted option name (``intra_op_threads``, ``cuda.enable_cuda_graph``)
    search: dict[str, SearchDim] = field(default_factory=dict)

    @property
    def availability(self) -> Availability:
        if self.checked is None:
            self.checked = self.instance.availability()
        return self.checked

    @availability.setter
    def availability(self, value: Availability) -> None:
        self.checked = value

    def variant(self, settings: dict[str, Any]) -> Target:
        """The target with ``settings`` (dotted option names) in place of its own options."""
        if not settings:
            return self.instance
        from engine.core.search import overlay

        return self.cls(self.cls.Config(**overlay(self.instance.config.model_dump(mode="json"), settings)))

    def settings_of(self, values: dict[str, Any]) -> dict[str, Any]:
        """The searched values that differ from the target's own options: a point's settings
        as they change the target (an empty dict is the target as written)."""
        from engine.core.search import flatten

        config = self.instance.config
        own = flatten(config.model_dump(mode="json"))
        changed = {name: value for name, value in sorted(values.items()) if own.get(name, _MISSING) != value}
        if not changed:
            return changed
        # a value that changes nothing the target is keyed by (an option set to what its default
        # means) is no setting: the same target spelled differently
        whole = self.variant(changed).config.to_json()
        for name in list(changed):
            rest = {k: v for k, v in changed.items() if k != name}
            if self.variant(rest).config.to_json() == whole:
                changed = rest
        return changed


@dataclass
class EvaluatorEntry:
    id: str
    name: str
    cls: Any
    config: dict[str, Any]
    timeout_s: float | None
    candidates: bool = True  # false: only for passes that measure with it
    typed_config: StrictConfig | None = None  # ``config`` as the evaluator's ``Config`` instance


@dataclass
class DataEntry:
    name: str
    cls: Any
    config: dict[str, Any]  # paths made absolute
    files: list[Path]
    typed_config: StrictConfig | None = None  # ``config`` as the source's ``Config`` instance


@dataclass
class ResolvedWorkflow:
    file: Path
    spec: Workflow
    input: InputModel
    steps: dict[str, Step]
    targets: dict[str, TargetEntry]
    evaluators: dict[str, EvaluatorEntry]
    datasets: dict[str, DataEntry]
    #: the environments built for its targets and steps, by key (engine.execute.environments.prepare)
    environments: dict[str, BuiltEnvironment] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def base_dir(self) -> Path:
        return self.file.parent
