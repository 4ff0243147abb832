"""Typed references: config fields that point at something of the workflow.

A plugin says what its options refer to by their types, not by class attributes listing option
names: ``calibration: DatasetRef | None`` names a dataset of the workflow's ``data:``,
``validation: EvaluationRef`` an evaluation of its ``evaluate:``, ``file: CodePath`` a Python file
whose code runs. The engine finds them by walking the ``Config`` model's field types
(``references``), and checks, keys and hands over what they name::

    class Config(PassConfig):
        calibration: DatasetRef | None = None
        num_heads: InputModelField[int | None] = None   # null: read from the input model

The markers are plain metadata: they change neither validation nor the JSON schema.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cache, reduce
from types import UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel


class RefKind(StrEnum):
    DATASET = "dataset"  # a name under the workflow's data:
    EVALUATION = "evaluation"  # an id of the workflow's evaluate: list
    FILE = "file"  # a path, made absolute against the workflow's folder and hashed by content
    INPUT_MODEL = "input_model"  # a value read from the workflow's input model when not given
    TASK = "task"  # the workflow input's task, filled in when the step does not set it


@dataclass(frozen=True)
class Ref:
    """The marker a reference type carries in its ``Annotated`` metadata."""

    kind: RefKind
    #: values that name something other than a reference (``tokenizer: input``)
    sentinels: tuple[str, ...] = ()
    #: a file whose Python code runs when the plugin does (listed by `engine validate`)
    code: bool = False


DatasetRef = Annotated[str, Ref(RefKind.DATASET)]
EvaluationRef = Annotated[str, Ref(RefKind.EVALUATION)]
FilePath = Annotated[str, Ref(RefKind.FILE)]
CodePath = Annotated[str, Ref(RefKind.FILE, code=True)]
#: a file path, or ``input``: the workflow's input model folder (a tokenizer, say)
FileOrInput = Annotated[str, Ref(RefKind.FILE, sentinels=("input",))]
InputModelRef = Ref(RefKind.INPUT_MODEL)
TaskRef = Ref(RefKind.TASK)

T = TypeVar("T")
#: an option whose null value is read from the workflow's input model (so its digest enters the key)
InputModelField = Annotated[T, InputModelRef]
#: the input's task: ``task: InputTask[Literal[...]]``; resolve fills it from ``input.task``
InputTask = Annotated[T, TaskRef]


def _markers(annotation: Any) -> list[Ref]:
    """The ``Ref`` markers in a type, looking through ``Annotated``, unions and containers."""
    found: list[Ref] = []
    stack = [annotation]
    while stack:
        current = stack.pop()
        if get_origin(current) is Annotated:
            found.extend(m for m in current.__metadata__ if isinstance(m, Ref))
        stack.extend(get_args(current))
    return found


def _has_annotated(annotation: Any) -> bool:
    return get_origin(annotation) is Annotated or any(_has_annotated(arg) for arg in get_args(annotation))


def without_markers(annotation: Any) -> Any:
    """The type with the ``Annotated`` wrappers inside unions taken off (``DatasetRef | None`` ->
    ``str | None``), as shown to a person; a type without any is returned as it is."""
    if not _has_annotated(annotation):
        return annotation
    if get_origin(annotation) is Annotated:
        return without_markers(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        return reduce(operator.or_, [without_markers(arg) for arg in get_args(annotation)])
    return annotation


@cache
def reference_fields(config_cls: type[BaseModel]) -> dict[str, Ref]:
    """Field name -> its reference marker, for the fields of ``config_cls`` that are references."""
    out: dict[str, Ref] = {}
    for name, info in config_cls.model_fields.items():
        markers = [m for m in info.metadata if isinstance(m, Ref)] + _markers(info.annotation)
        if markers:
            out[name] = markers[0]
    return out


def references(config_cls: type[BaseModel]) -> dict[RefKind, tuple[str, ...]]:
    """Kind -> the names of the fields of that kind, in declaration order (kinds with none left out)."""
    out: dict[RefKind, tuple[str, ...]] = {}
    for name, ref in reference_fields(config_cls).items():
        out[ref.kind] = (*out.get(ref.kind, ()), name)
    return out


def referenced(config_cls: type[BaseModel], config: Mapping[str, Any] | BaseModel | None, kind: RefKind) -> dict[str, str]:
    """Option -> the name or path it holds, for the options of ``kind`` set to a string in ``config``
    (a sentinel such as ``tokenizer: input`` is not a reference)."""
    values = config.model_dump() if isinstance(config, BaseModel) else dict(config or {})
    out: dict[str, str] = {}
    for name, ref in reference_fields(config_cls).items():
        value = values.get(name)
        if ref.kind != kind or not isinstance(value, str) or value in ref.sentinels:
            continue
        if value or kind != RefKind.FILE:  # an empty path names no file
            out[name] = value
    return out


__all__ = [
    "CodePath",
    "DatasetRef",
    "EvaluationRef",
    "FileOrInput",
    "FilePath",
    "InputModelField",
    "InputModelRef",
    "InputTask",
    "Ref",
    "RefKind",
    "TaskRef",
    "reference_fields",
    "referenced",
    "references",
    "without_markers",
]
