"""Reading a workflow file: parse YAML or JSON (by extension) and remember where each key stands.

Line numbers come from YAML's node marks. JSON is parsed by ``json`` (so JSON's rules hold), and
its lines are read by composing the same text as YAML, whose flow syntax covers JSON documents.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from engine.core.errors import InputError, Problem
from engine.workflow.parse import MAX_DEPTH, ParseError, Path_, check_values, parse_json, parse_yaml


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


MAX_FILE_BYTES = 4 * 1024 * 1024  # a 20,000-step workflow is about 1 MiB


def shown_path(text: str, limit: int = 200) -> str:
    """A path as shown in a message: a 5,000-character name is cut, control characters escaped."""
    shown = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _refuse(file: Path, message: str, line: int | None = None, **kwargs: Any) -> InputError:
    return InputError([Problem(where="", message=message, file=shown_path(str(file)), line=line, **kwargs)])


def _read_text(file: Path) -> str:
    """The file's text, refused quickly when it is not a regular file of a sane size: a FIFO,
    /dev/zero or a directory is never read, a huge file never loaded."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise _refuse(file, "workflow file not found", given=shown_path(str(file)), hint="check the path") from None
    except (OSError, ValueError) as error:  # ValueError: a NUL byte in the path
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise _refuse(file, f"cannot open the workflow file: {reason}", given=shown_path(str(file)), hint="check the path") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # checked before fdopen, which refuses a directory with an OSError
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a special file"
        raise _refuse(
            file,
            f"the workflow path is {kind}, not a regular file",
            expected="a .yaml, .yml or .json file",
            given=shown_path(str(file)),
            hint="give the path of a .yaml or .json file",
        )
    with os.fdopen(fd, "rb") as handle:
        raw = handle.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise _refuse(
            file,
            f"the workflow file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB",
            given=f"{max(info.st_size, len(raw)):,} bytes",
            hint="a workflow is a few kilobytes; check the path",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise _refuse(file, f"the file is not UTF-8 text ({error.reason})", line=line, hint="save the file as UTF-8") from None
    if text.startswith("\ufeff"):  # a byte-order mark, as some editors write UTF-8: read past it, in YAML and JSON alike
        text = text[1:]
    if "\x00" in text:
        raise _refuse(file, "the file holds a NUL byte", line=text.count("\n", 0, text.index("\x00")) + 1, hint="remove it")
    return text


def _parse(file: Path, text: str) -> Any:
    """The parsed file (``Parsed``); malformed text raises InputError with its line."""
    try:
        return parse_json(text) if file.suffix.lower() == ".json" else parse_yaml(text)
    except ParseError as error:
        problem = WorkflowSource(file=file, data=None).problem(error.where, error.message, hint=error.hint)
        raise InputError([replace(problem, line=error.line)]) from None
    except json.JSONDecodeError as error:
        hint = f"fix the syntax at line {error.lineno}, column {error.colno}"
        raise InputError(
            [Problem(where="", message=f"malformed JSON: {error.msg}", file=str(file), line=error.lineno, hint=hint)]
        ) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        what = getattr(error, "problem", None) or str(error)
        if "maximum nesting depth" in what:  # PyYAML >= 6.0.3's own bound, met while scanning ahead of ours
            problem = WorkflowSource(file=file, data=None).problem(
                (), f"nested deeper than {MAX_DEPTH} levels", hint="a workflow needs far fewer levels"
            )
            raise InputError([replace(problem, line=line)]) from None
        raise InputError(
            [Problem(where="", message=f"malformed YAML: {what}", file=str(file), line=line, hint="fix the syntax at the line shown")]
        ) from None


def read_workflow(file: Path) -> WorkflowSource:
    """Parse ``file``; a file that cannot be read or parsed raises InputError with its line."""
    file = Path(file)
    suffix = file.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        given = shown_path(suffix) or "no extension"
        problem = Problem(
            where="", message="cannot tell the file's format", expected=".yaml, .yml or .json", given=given, file=shown_path(str(file))
        )
        raise InputError([problem])
    parsed = _parse(file, _read_text(file))
    data = parsed.data
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
    source = WorkflowSource(file=file, data=data, lines=parsed.lines)
    bad = check_values(data)
    if bad:
        raise InputError([source.problem(where, message, hint=hint) for where, message, hint in bad])
    return source
