"""Reading a workflow file: parse YAML or JSON (by extension) and remember where each key stands.

Line numbers come from YAML's node marks. JSON is parsed by ``json`` (so JSON's rules hold), and
its lines are read by composing the same text as YAML, whose flow syntax covers JSON documents.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from engine.core.errors import InputError, Problem

Path_ = tuple[str | int, ...]


def key_path(parts: Path_) -> str:
    """('steps', 1, 'config', 'mode') -> 'steps[1].config.mode'."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


@dataclass
class WorkflowSource:
    file: Path
    data: Any
    lines: dict[Path_, int] = field(default_factory=dict)

    def line_of(self, parts: Path_) -> int | None:
        """The line of the deepest known key on ``parts`` (a missing key points at its parent)."""
        parts = tuple(parts)
        while parts:
            if parts in self.lines:
                return self.lines[parts]
            parts = parts[:-1]
        return self.lines.get((), None)

    def problem(self, parts: Path_, message: str, **kwargs: Any) -> Problem:
        return Problem(where=key_path(parts), message=message, file=str(self.file), line=self.line_of(parts), **kwargs)


class _Loader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1's surprises: 'on'/'off'/'yes'/'no' stay strings."""


_Loader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.copy().items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    __import__("re").compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


def _line_map(node: yaml.Node | None, parts: Path_ = (), out: dict[Path_, int] | None = None) -> dict[Path_, int]:
    out = {} if out is None else out
    if node is None:
        return out
    out.setdefault(parts, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            out[(*parts, key)] = key_node.start_mark.line + 1
            _line_map(value_node, (*parts, key), out)
            out[(*parts, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _line_map(item, (*parts, index), out)
    return out


def read_workflow(file: Path) -> WorkflowSource:
    """Parse ``file``; a file that cannot be read or parsed raises InputError with its line."""
    file = Path(file)
    if not file.exists():
        raise InputError([Problem(where="", message="workflow file not found", given=str(file), hint="check the path", file=str(file))])
    suffix = file.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise InputError(
            [
                Problem(
                    where="",
                    message="cannot tell the file's format",
                    expected=".yaml, .yml or .json",
                    given=suffix or "no extension",
                    file=str(file),
                )
            ]
        )
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError([Problem(where="", message=f"cannot read the file: {error}", file=str(file))]) from None
    try:
        if suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.load(text, Loader=_Loader)
    except json.JSONDecodeError as error:
        raise InputError(
            [
                Problem(
                    where="",
                    message=f"malformed JSON: {error.msg}",
                    file=str(file),
                    line=error.lineno,
                    hint=f"fix the syntax at line {error.lineno}, column {error.colno}",
                )
            ]
        ) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        what = getattr(error, "problem", None) or str(error)
        raise InputError(
            [Problem(where="", message=f"malformed YAML: {what}", file=str(file), line=line, hint="fix the syntax at the line shown")]
        ) from None
    if not isinstance(data, dict):
        raise InputError(
            [
                Problem(
                    where="",
                    message="a workflow is a mapping of keys",
                    expected="version, name, input, targets, steps, evaluate, select, ...",
                    given=type(data).__name__,
                    file=str(file),
                    line=1,
                )
            ]
        )
    try:
        lines = _line_map(yaml.compose(text, Loader=_Loader))
    except yaml.YAMLError:
        lines = {}
    return WorkflowSource(file=file, data=data, lines=lines)
