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


def _field_at(model: type[BaseModel] | None, loc: tuple[str | int, ...]) -> Any:
    """The annotation of the field at ``loc`` inside ``model``, or None when unknown."""
    current: Any = model
    annotation: Any = None
    for part in loc:
        if isinstance(part, int):
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return None
        annotation = fields[part].annotation
        current = next(
            (arg for arg in (annotation, *getattr(annotation, "__args__", ())) if isinstance(arg, type) and issubclass(arg, BaseModel)),
            None,
        )
    return annotation


#: what a value must be, by pydantic's error type (and its context)
_EXPECTED = {
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "greater_than": "greater than {gt}",
    "greater_than_equal": "at least {ge}",
    "less_than": "less than {lt}",
    "less_than_equal": "at most {le}",
    "string_too_long": "at most {max_length} characters",
    "string_too_short": "at least {min_length} characters",
    "too_long": "at most {max_length} items",
    "too_short": "at least {min_length} items",
    "string_pattern_mismatch": "text matching {pattern}",
}
#: error types that say the value is of the wrong type (not a value out of its bounds)
TYPE_ERRORS = frozenset(kind for kind in _EXPECTED if kind.endswith(("_type", "_parsing", "from_float"))) | {"literal_error"}


def expected_value(kind: str, ctx: dict[str, Any], annotation: Any = None) -> str | None:
    """What a value must be, from a pydantic error's type and context, else from the field's type."""
    if "expected" in ctx:
        return str(ctx["expected"])
    if kind in _EXPECTED:
        try:
            return _EXPECTED[kind].format(**ctx)
        except (KeyError, IndexError):
            return None
    if annotation is not None:
        from engine.text.typetext import type_text

        text = type_text(annotation)
        return None if "object" in text or text == "any" else text  # a mapping's own check: its message says it
    return None


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
            ctx = item.get("ctx") or {}
            expected = expected_value(kind, ctx, _field_at(model, loc))
            if expected is None:
                hint = "change the value as the message says"
            elif kind in TYPE_ERRORS:
                hint = f"write {expected} (a value of another type is not converted)"
            else:
                hint = f"use a value {expected}" if kind in _EXPECTED else f"use {expected}"
            problems.append(
                source.problem(
                    parts,
                    f"invalid value for {owner}: {message}",
                    expected=expected,
                    given=_show(item.get("input")),
                    hint=hint,
                )
            )
    return problems
