"""Values as a person reads them, the same in every table, verdict and page Kiln writes: numbers
(one against a bound never rounded onto it), booleans as a workflow file spells them, search
spaces, candidate ids in natural order, speedups, and text fitted to the terminal's width
(plain text: the `engine` command imports it at start, before any rich table is needed)."""

from __future__ import annotations

import math
import os
import re
import sys
import textwrap
from collections.abc import Mapping
from typing import IO, Any

#: the width of output that goes to a pipe or a file and COLUMNS does not give one
PIPED_WIDTH = 100


def terminal_width(stream: IO[str] | None = None) -> int | None:
    """COLUMNS when set; else the terminal's width when ``stream`` is a terminal; else None."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        if stream is not None and stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        pass
    return None


def output_width(stream: IO[str] | None = None) -> int:
    """The width tables are laid out at: ``terminal_width``, else (a pipe, a CI log) 100."""
    return terminal_width(stream) or PIPED_WIDTH


_PLACE = re.compile(r"^(\S+:\d+:) \S+:(\s|$)")
_GLUE = "\x00"
_LABELLED = re.compile(r"^(\s*)(expected|given|fix|hint|note|why):\s+")


def message_width() -> int | None:
    """The width messages on stderr wrap at: only on a terminal (COLUMNS, else its width). Piped
    or written to a file, a message stays one line, for grep and for logs that wrap themselves;
    COLUMNS alone does not wrap it there (GNU readline exports COLUMNS into every child of a
    process that loaded it, so its presence says nothing about where the text goes)."""
    try:
        on_terminal = sys.stderr.isatty()
    except (AttributeError, ValueError):
        on_terminal = False
    return terminal_width(sys.stderr) if on_terminal else None


def wrap(text: str, width: int | None = None) -> str:
    """Each line of ``text`` wrapped at ``width`` (default: ``message_width``: on a terminal
    only); a wrapped line's continuation is indented under its text ("expected: ..." under the
    value), and the first line keeps its ``file:line: key:`` prefix. Words (paths, keys) are
    never broken."""
    width = width or message_width()
    if not width:
        return text
    out = []
    for line in text.splitlines():
        place = _PLACE.match(line)
        if place:  # "file:line: key:" stays together however long the path is
            line = place.group(1) + _GLUE + line[place.end(1) + 1 :]
        labelled = _LABELLED.match(line)
        lead = len(line) - len(line.lstrip(" "))
        indent = " " * (labelled.end() if labelled else lead + 4)
        wrapped = textwrap.wrap(
            line, width=width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False, drop_whitespace=True
        )
        if wrapped and lead:
            wrapped[0] = " " * lead + wrapped[0].lstrip(" ")
        out += wrapped or [line]
    return "\n".join(out).replace(_GLUE, " ")


def number(value: float | None) -> str:
    """A measured figure: four significant digits (``—`` when missing)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.4g}"


def bound(value: float) -> str:
    """A bound a person wrote (``min: 0.99``): as written, to the precision a float keeps."""
    return f"{value:.12g}"


def against(value: float, limit: float, percent: bool = False) -> str:
    """``value`` compared with ``limit``: with as many significant digits as it takes for the text
    to fall on the same side of the limit as the value (0.98996 against 0.99, never "0.99")."""
    scale = 100.0 if percent else 1.0
    unit = "%" if percent else ""
    for digits in range(4, 16):
        text = f"{value * scale:.{digits}g}"
        shown = float(text) / scale
        if (shown > limit) == (value > limit) and (shown < limit) == (value < limit):
            return text + unit
    return repr(value * scale) + unit


def flag(value: Any) -> str:
    """A boolean as a workflow file spells it (``true``/``false``); ``-`` for unknown."""
    if value is None:
        return "-"
    return "true" if value else "false"


def value_text(value: Any) -> str:
    """Any option value as written in a workflow: ``true``, ``null``, ``"a"``, ``[1, 2]``."""
    if isinstance(value, bool) or value is None:
        return "null" if value is None else flag(value)
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    return str(value)


def space_text(space: Mapping[str, Any]) -> str:
    """A search dimension (its JSON) in words: ``one of false, true``, ``int 1 to 8 (step 2)``,
    ``float 0.1 to 1 (log scale)``."""
    kind = space.get("kind")
    if kind == "categorical":
        return "one of " + ", ".join(value_text(v) for v in space.get("choices", []))
    extra = []
    if space.get("step") not in (None, 1):
        extra.append(f"step {value_text(space['step'])}")
    if space.get("log"):
        extra.append("log scale")
    if space.get("grid_points"):
        extra.append(f"{space['grid_points']} grid points")
    more = f" ({', '.join(extra)})" if extra else ""
    return f"{kind} {value_text(space.get('low'))} to {value_text(space.get('high'))}{more}"


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders runs of digits by value: ``ov-cpu/2`` before ``ov-cpu/10``."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text) if part)


def speedup(value: float | None, low: float | None = None, high: float | None = None) -> str:
    """A paired speedup with its interval: ``2.002x [1.98, 2.01]``."""
    if value is None:
        return "—"
    text = f"{number(value)}x"
    if low is not None and high is not None and low != high:
        text += f" [{number(low)}, {number(high)}]"
    return text
