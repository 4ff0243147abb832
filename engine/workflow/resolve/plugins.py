"""Plugins by name: the one lookup that validation and ``engine schema`` share.

A workflow names a plugin in four places; ``SECTIONS`` says, for each registry kind, which key
names the plugin and where its options sit. ``resolve`` validates each section's options against
the named plugin's ``Config``; ``schema_doc`` folds the same ``Config`` schemas into the workflow
schema, one branch per plugin, from the same table and the same loader.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engine import registry
from engine.core.config import StrictConfig
from engine.core.errors import KilnError, Problem
from engine.workflow import files as userfiles
from engine.workflow.problems import problems_from_validation
from engine.workflow.source import WorkflowSource, shown_path

log = logging.getLogger(__name__)

Where = tuple[str | int, ...]


@dataclass(frozen=True)
class Section:
    kind: str  # the registry kind
    key: str  # the key that names the plugin
    options_at: str  # the key holding the plugin's options; "": beside the key, in the same mapping


SECTIONS = {
    "passes": Section("passes", "pass", "config"),
    "evaluators": Section("evaluators", "evaluator", "config"),
    "targets": Section("targets", "runtime", ""),
    "datasources": Section("datasources", "source", ""),
}


def config_model(cls: Any) -> type[StrictConfig]:
    """The pydantic model a plugin's options are validated against (and documented by)."""
    model: type[StrictConfig] = cls.Config
    return model


def loadable(kind: str) -> dict[str, Any]:
    """Every registered plugin of ``kind`` that loads, by name; a broken or uninstalled one is
    logged and left out (it must not take ``engine schema`` down)."""
    out = {}
    for name in registry.names(kind):
        try:
            out[name] = registry.load(kind, name)
        except KilnError as error:
            log.warning("%s", error)
    return out


def lookup(kind: str, name: Any, source: WorkflowSource, where: Where, problems: list[Problem]) -> Any | None:
    """The plugin ``name`` of ``kind``, or None and a problem naming the close ones."""
    if not isinstance(name, str):
        return None  # the structural check reports the type
    try:
        return registry.load(kind, name)
    except registry.UnknownPlugin as error:
        hint = f"did you mean '{error.suggestion}'?" if error.suggestion else f"see `engine {kind if kind != 'datasources' else 'data'}`"
        problems.append(
            source.problem(
                where,
                f"unknown {registry.SINGULAR[kind]} '{name}'",
                expected="one of: " + ", ".join(error.known),
                given=name,
                hint=hint,
            )
        )
        return None


def validate_config(
    cls: type[StrictConfig], values: Any, source: WorkflowSource, base: Where, owner: str, problems: list[Problem]
) -> StrictConfig | None:
    """``values`` as an instance of the plugin's ``Config``, or None and the problems."""
    if not isinstance(values, dict):
        problems.append(source.problem(base, f"options of {owner} must be a mapping", given=type(values).__name__))
        return None
    try:
        return cls(**values)
    except ValidationError as error:
        problems.extend(problems_from_validation(error, source, base, cls, owner))
        return None
    except TypeError as error:
        problems.append(source.problem(base, f"invalid options for {owner}: {error}"))
        return None


def user_file(text: str, source: WorkflowSource, where: Where, problems: list[Problem]) -> Path | None:
    """A path option made absolute (relative to the workflow's folder), or None and a problem."""
    try:
        return userfiles.user_path(source.file.parent, text)
    except ValueError as error:
        problems.append(
            source.problem(
                where,
                f"invalid path: {error}",
                expected="the path of a regular file or a folder",
                given=shown_path(text),
                hint="give the path of an existing regular file (or folder)",
            )
        )
        return None


def existing_file(text: str, source: WorkflowSource, where: Where, missing: str, problems: list[Problem]) -> Path | None:
    """``user_file``, and a problem saying ``missing`` when no file is there. The absolute path, or
    None when the text cannot be a path."""
    file = user_file(text, source, where, problems)
    if file is not None and not userfiles.exists(file):
        problems.append(source.problem(where, missing, given=str(file), hint="relative paths start at the workflow file's folder"))
    return file
