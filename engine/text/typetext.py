"""An option's type as a person writes its value in a workflow (``bool``, ``list[str]``,
``"a" | "b"``, ``int | null``) rather than Python's repr (``<class 'bool'>``, ``Literal['a']``)."""

from __future__ import annotations

import enum
import json
import types
from pathlib import PurePath
from typing import Annotated, Any, Literal, Union, get_args, get_origin

_NAMES = {bool: "bool", int: "int", float: "float", str: "str", bytes: "str", type(None): "null", dict: "object", list: "list"}
_SEQUENCES = (list, tuple, set, frozenset)


def type_text(annotation: Any) -> str:
    """``annotation`` written as in a workflow; ``null`` goes last in a union."""
    if annotation is Any:
        return "any"
    if annotation in _NAMES:
        return _NAMES[annotation]
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Annotated:
        return type_text(args[0])
    if origin is Literal:
        return " | ".join(_literal(value) for value in args)
    if origin in (Union, types.UnionType):
        parts = [type_text(arg) for arg in args if arg is not type(None)]
        return " | ".join(dict.fromkeys(parts)) + (" | null" if type(None) in args else "")
    if origin in _SEQUENCES:
        items = [a for a in args if a is not Ellipsis]
        inner = ", ".join(dict.fromkeys(type_text(a) for a in items))
        return f"list[{inner}]" if inner else "list"
    if origin is dict:
        return f"dict[{type_text(args[0])}, {type_text(args[1])}]" if args else "object"
    if isinstance(annotation, type):
        return _class_text(annotation)
    return str(annotation).replace("typing.", "")


def _literal(value: Any) -> str:
    return json.dumps(value.value if isinstance(value, enum.Enum) else value)


def _class_text(cls: type) -> str:
    if issubclass(cls, enum.Enum):
        return " | ".join(_literal(member) for member in cls)
    if issubclass(cls, PurePath):
        return "str (a path)"
    if cls in _SEQUENCES:
        return "list"
    return "object" if hasattr(cls, "model_fields") else cls.__name__
