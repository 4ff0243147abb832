"""Turning pydantic's validation errors into Problems: one template for every bad value."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from engine.core.errors import Problem
from engine.registry import suggest
from engine.workflow.hub import mask_tokens
from engine.workflow.source import Path_, WorkflowSource


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    text = mask_tokens(text)  # a Hugging Face token is never echoed
    return text if len(text) <= 120 else text[:117] + "..."


def _fields_at(model: type[BaseModel] | None, loc: tuple[str | int, ...]) -> list[str]:
    """The option names allowed at ``loc`` inside ``model`` (for "did you mean")."""
    current: Any = model
    for part in loc:
        if current is None or isinstance(part, int):
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        annotation = fields[part].annotation
        current = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        for arg in getattr(annotation, "__args__", ()):  # list[StepSpec], StepSpec | None
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                current = arg
    fields = getattr(current, "model_fields", None) or {}
    return [info.alias or name for name, info in fields.items()]


def problems_from_validation(
    error: ValidationError, source: WorkflowSource, base: Path_, model: type[BaseModel] | None, owner: str
) -> list[Problem]:
    """One Problem per pydantic error, located at ``base + loc`` in the file.

    ``owner`` says whose option it is ("the workflow", "pass 'ort_quantize'") so the message
    reads like scikit-learn's parameter errors: the parameter, its owner, what is allowed, what
    was given.
    """
    problems = []
    for item in error.errors(include_url=False):
        loc = tuple(part for part in item["loc"] if not (isinstance(part, str) and part.startswith("function-")))
        kind = item["type"]
        parts = (*base, *loc)
        if kind == "extra_forbidden":
            allowed = _fields_at(model, loc[:-1])
            name = str(loc[-1])
            close = suggest(name, allowed)
            problems.append(
                source.problem(
                    parts,
                    f"unknown key '{name}' for {owner}",
                    expected="one of: " + ", ".join(allowed) if allowed else None,
                    given=name,
                    hint=f"did you mean '{close}'?" if close else "remove it",
                )
            )
        elif kind == "missing":
            problems.append(source.problem(parts, f"required key '{loc[-1]}' of {owner} is missing", hint=f"add '{loc[-1]}'"))
        else:
            message = item["msg"]
            if message.startswith("Value error, "):
                message = message[len("Value error, ") :]
            expected = None
            ctx = item.get("ctx") or {}
            if "expected" in ctx:
                expected = str(ctx["expected"])
            problems.append(
                source.problem(
                    parts,
                    f"invalid value for {owner}: {message}",
                    expected=expected,
                    given=_show(item.get("input")),
                )
            )
    return problems
