"""The plugin sections of a workflow: datasets, targets and evaluations, each checked against
the named plugin's ``Config``; file options (``FilePath``) made absolute and checked to exist."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engine import registry
from engine.core.errors import Problem
from engine.core.refs import RefKind, reference_fields
from engine.core.search import flatten
from engine.core.target import Availability
from engine.workflow.hub import HubProblem
from engine.workflow.hub_data import locate_dataset
from engine.workflow.problems import problems_from_validation
from engine.workflow.resolve.checks import dataset_refs, fixed_and_searched
from engine.workflow.resolve.model import DataEntry, EvaluatorEntry, TargetEntry
from engine.workflow.resolve.parts import Parts
from engine.workflow.resolve.plugins import Where, config_model, existing_file, lookup, validate_config
from engine.workflow.resolve.search import resolve_target_search
from engine.workflow.source import WorkflowSource


def absolute_files(
    cls: Any, values: dict[str, Any], source: WorkflowSource, where: Where, what: str, problems: list[Problem]
) -> list[Path]:
    """Make the ``FilePath`` options of ``values`` absolute, in place; the files, checked to exist.
    ``what(option)`` says whose file a missing one is."""
    files = []
    for option, ref in reference_fields(cls.Config).items():
        value = values.get(option)
        if ref.kind != RefKind.FILE or not isinstance(value, str) or value in ref.sentinels:
            continue
        file = existing_file(value, source, (*where, option), what.replace("{option}", option), problems)
        if file is not None:
            values[option] = str(file)
            files.append(file)
    return files


def _no_source(name: str, options: dict[str, Any], source: WorkflowSource, where: Where) -> Problem:
    return source.problem(
        (*where, "source"),
        f"dataset '{name}' needs a source (a name)",
        expected="one of: " + ", ".join(registry.names("datasources")),
        given=None if "source" not in options else repr(options["source"]),
        hint="add source: <data source>; see `engine data`",
    )


def resolve_data(parts: Parts, source: WorkflowSource, problems: list[Problem]) -> dict[str, DataEntry]:
    datasets: dict[str, DataEntry] = {}
    for name, options in parts.data.items():
        where = ("data", name)
        if not isinstance(options.get("source"), str):
            problems.append(_no_source(name, options, source, where))
            continue
        cls = lookup("datasources", options["source"], source, (*where, "source"), problems)
        if cls is None:
            continue
        values = dict(options)
        files = absolute_files(cls, values, source, where, f"the file of dataset '{name}' does not exist", problems)
        if getattr(cls, "hub_dataset", False) and not _hub_snapshot(values, source, where, problems):
            continue
        config = validate_config(config_model(cls), values, source, where, f"data source '{cls.name}'", problems)
        if config is not None:
            datasets[name] = DataEntry(name=name, cls=cls, config=config.to_json(), files=files, typed_config=config)
    return datasets


def _hub_snapshot(values: dict[str, Any], source: WorkflowSource, where: Where, problems: list[Problem]) -> bool:
    """A Hub dataset found in the cache: its ``commit`` and snapshot ``folder`` set in ``values``; else a problem."""
    for key in ("commit", "folder"):
        if key in values:
            problems.append(
                source.problem(
                    (*where, key),
                    f"'{key}' is set by Kiln from the Hub cache",
                    given=repr(values[key]),
                    hint=f"remove '{key}'; pin the dataset with `revision:`",
                )
            )
            return False
    try:
        commit, folder = locate_dataset(values.get("name"), values.get("revision"))
    except HubProblem as error:
        problems.append(source.problem((*where, error.key), error.message, given=error.given, expected=error.expected, hint=error.hint))
        return False
    values["commit"], values["folder"] = commit, str(folder)
    return True


def _target(index: int, options: Any, source: WorkflowSource, problems: list[Problem]) -> TargetEntry | None:
    where = ("targets", index)
    if not isinstance(options, dict):
        problems.append(source.problem(where, "a target is a mapping", expected="{id, runtime, device, ...}", given=type(options).__name__))
        return None
    if "runtime" not in options:
        hint, expected = "add runtime: <name>", "one of: " + ", ".join(registry.names("targets"))
        problems.append(source.problem(where, "a target needs a runtime", expected=expected, hint=hint))
        return None
    cls = lookup("targets", options.get("runtime"), source, (*where, "runtime"), problems)
    if cls is None:
        return None
    # `search:` is the workflow's (the target's searched session settings), not the runtime's
    options = dict(options)
    raw_search = options.pop("search", None)
    problems.extend(fixed_and_searched(flatten(options), raw_search, source, where))
    try:
        config = cls.Config(**options)
    except ValidationError as error:
        problems.extend(problems_from_validation(error, source, where, cls.Config, f"runtime '{cls.runtime}'"))
        return None
    owner = f"target '{config.id}' ({cls.runtime})"
    search = resolve_target_search(cls, config.model_dump(mode="json"), raw_search, source, where, owner, problems)
    instance = cls(config)
    if config.environment is not None:  # checked inside the environment (engine.execute.environments.prepare)
        return TargetEntry(
            id=config.id,
            cls=cls,
            instance=instance,
            checked=Availability(ok=False, reason=config.environment.not_built()),
            search=search,
        )
    return TargetEntry(id=config.id, cls=cls, instance=instance, search=search)  # its availability: on first use


def resolve_targets(parts: Parts, source: WorkflowSource, problems: list[Problem]) -> dict[str, TargetEntry]:
    targets: dict[str, TargetEntry] = {}
    for index, options in enumerate(parts.targets):
        entry = _target(index, options, source, problems)
        if entry is None:
            continue
        if entry.id in targets:
            problems.append(
                source.problem(("targets", index, "id"), f"target id '{entry.id}' is used twice", hint="give each target its own id")
            )
            continue
        targets[entry.id] = entry
    return targets


def resolve_evaluators(parts: Parts, source: WorkflowSource, problems: list[Problem]) -> dict[str, EvaluatorEntry]:
    evaluators: dict[str, EvaluatorEntry] = {}
    for index, spec in parts.evaluate:
        where = ("evaluate", index)
        cls = lookup("evaluators", spec.evaluator, source, (*where, "evaluator"), problems)
        if cls is None:
            continue
        values = dict(spec.config)
        missing = "the file named by evaluation option '{option}' does not exist"
        absolute_files(cls, values, source, (*where, "config"), missing, problems)
        config = validate_config(config_model(cls), values, source, (*where, "config"), f"evaluator '{cls.name}'", problems)
        config_json = config.to_json() if config is not None else None
        problems.extend(dataset_refs(cls, config_json, parts.data_names, source, (*where, "config")))
        if spec.id in evaluators:
            problems.append(source.problem((*where, "id"), f"evaluation id '{spec.id}' is used twice"))
        elif config_json is not None:
            evaluators[spec.id] = EvaluatorEntry(
                id=spec.id,
                name=cls.name,
                cls=cls,
                config=config_json,
                timeout_s=spec.timeout_s,
                candidates=spec.candidates,
                typed_config=config,
            )
    return evaluators
