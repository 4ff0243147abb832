"""Parsing workflow text within bounds: a hostile file is refused quickly, never walked forever.

YAML is composed here from the parser's events, without recursion: nesting deeper than
``MAX_DEPTH`` is refused, an alias must name an anchor completed before it (so anchors cannot
refer to themselves), and every node's expanded size is counted once, when it is complete, so
"billion laughs" is refused once aliases would add more than ``MAX_ALIAS_NODES`` nodes. Keys may
appear once per mapping. The same pass records the line of every key path; an aliased node is
never walked again, its path points at the alias.

JSON is parsed by ``json`` (so JSON's rules hold) and composed as YAML for its lines and checks.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

Path_ = tuple[str | int, ...]

MAX_DEPTH = 32  # a workflow needs about 7 levels
MAX_ALIAS_NODES = 10_000  # nodes that aliases may add to a document
MAX_INT_DIGITS = 30  # longer integers are refused before Python converts them
INT_LIMIT = 2**63 - 1

_INT_TAG = "tag:yaml.org,2002:int"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class ParseError(Exception):
    """Text that is not a workflow Kiln will read: the reason, the line and key path when known."""

    def __init__(self, message: str, line: int | None = None, where: Path_ = (), hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.where = where
        self.hint = hint


class SafeLoader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1's surprises: 'on'/'off'/'yes'/'no' stay strings, and so do
    dates (a workflow has no use for timestamps, and a bad one would fail in the constructor)."""


SafeLoader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp")]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.copy().items()
}
SafeLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


@dataclass
class Parsed:
    data: Any
    lines: dict[Path_, int] = field(default_factory=dict)


@dataclass
class _Open:
    """A collection being composed."""

    node: yaml.CollectionNode
    path: Path_
    anchor: str | None
    size: int = 1
    key: yaml.ScalarNode | None = None
    keys: set[tuple[str, str]] = field(default_factory=set)


def _events(text: str) -> Any:
    loader = yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else SafeLoader
    return yaml.parse(text, Loader=loader)


class _Composer:
    """Builds the node graph event by event, bounded as above, noting the line of each key path."""

    def __init__(self, resolver: SafeLoader) -> None:
        self.resolver = resolver
        self.anchors: dict[str, tuple[yaml.Node, int]] = {}
        self.lines: dict[Path_, int] = {}
        self.stack: list[_Open] = []
        self.root: list[yaml.Node] = []
        self.extra = 0  # values added by aliases
        self.documents = 0

    def path_here(self) -> Path_:
        if not self.stack:
            return ()
        parent = self.stack[-1]
        if isinstance(parent.node, yaml.SequenceNode):
            return (*parent.path, len(parent.node.value))
        return parent.path if parent.key is None else (*parent.path, parent.key.value)

    def _key(self, parent: _Open, node: yaml.Node, line: int) -> None:
        if not isinstance(node, yaml.ScalarNode):
            raise ParseError("a key must be a plain name, not a list or a mapping", line, parent.path)
        marker = (node.tag, node.value)
        if marker in parent.keys and node.tag != _MERGE_TAG:
            raise ParseError(
                f"key '{node.value}' appears twice in this mapping",
                line,
                (*parent.path, node.value),
                hint="keep one of them (a parser would silently keep the last)",
            )
        parent.keys.add(marker)
        parent.key = node
        self.lines[(*parent.path, node.value)] = line

    def attach(self, node: yaml.Node, size: int, line: int) -> None:
        if not self.stack:
            self.root.append(node)
            return
        parent = self.stack[-1]
        if isinstance(parent.node, yaml.SequenceNode):
            parent.node.value.append(node)
            parent.size += size
        elif parent.key is None:
            self._key(parent, node, line)
        else:
            parent.node.value.append((parent.key, node))
            parent.key = None
            parent.size += size + 1

    def register(self, anchor: str | None, node: yaml.Node, size: int) -> None:
        if anchor is not None:
            self.anchors[anchor] = (node, size)

    def alias(self, event: yaml.AliasEvent, line: int | None, where: Path_, is_key: bool) -> None:
        if event.anchor not in self.anchors:
            raise ParseError(
                f"alias '*{event.anchor}' names no anchor completed before it",
                line,
                where,
                hint="define '&name' before using '*name'; an anchor cannot contain its own alias",
            )
        if is_key:
            raise ParseError("a key must be a plain name, not an alias", line, where)
        node, size = self.anchors[event.anchor]
        self.extra += size
        if self.extra > MAX_ALIAS_NODES:
            raise ParseError(
                f"aliases expand to more than {MAX_ALIAS_NODES:,} values",
                line,
                where,
                hint="write the values out, or alias smaller blocks",
            )
        self.attach(node, size, line or 0)

    def scalar(self, event: yaml.ScalarEvent, line: int | None, where: Path_) -> None:
        tag = self.resolver.resolve(yaml.ScalarNode, event.value, event.implicit)
        if tag == _INT_TAG and len(event.value) > MAX_INT_DIGITS:
            raise ParseError(f"an integer of {len(event.value):,} digits", line, where, hint="use a number below 2^63")
        scalar = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, style=event.style)
        self.register(event.anchor, scalar, 1)
        self.attach(scalar, 1, line or 0)

    def open(self, event: yaml.CollectionStartEvent, line: int | None, where: Path_) -> None:
        if len(self.stack) >= MAX_DEPTH:
            raise ParseError(f"nested deeper than {MAX_DEPTH} levels", line, where, hint="a workflow needs far fewer levels")
        collection: yaml.CollectionNode
        if isinstance(event, yaml.SequenceStartEvent):
            tag = self.resolver.resolve(yaml.SequenceNode, None, event.implicit)
            collection = yaml.SequenceNode(tag, [], event.start_mark, None, flow_style=event.flow_style)
        else:
            tag = self.resolver.resolve(yaml.MappingNode, None, event.implicit)
            collection = yaml.MappingNode(tag, [], event.start_mark, None, flow_style=event.flow_style)
        self.stack.append(_Open(node=collection, path=where, anchor=event.anchor))

    def close(self, line: int | None) -> None:
        done = self.stack.pop()
        self.register(done.anchor, done.node, done.size)
        self.attach(done.node, done.size, line or 0)

    def feed(self, event: yaml.Event) -> None:
        if isinstance(event, (yaml.StreamStartEvent, yaml.StreamEndEvent, yaml.DocumentEndEvent)):
            return
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        if isinstance(event, yaml.DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:
                raise ParseError("a workflow file holds one YAML document", line, hint="remove the second '---' and what follows")
            return
        if isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            self.close(line)
            return
        where = self.path_here()
        is_key = bool(self.stack) and isinstance(self.stack[-1].node, yaml.MappingNode) and self.stack[-1].key is None
        if not is_key:
            self.lines.setdefault(where, line or 0)
        if isinstance(event, yaml.AliasEvent):
            self.alias(event, line, where, is_key)
            return
        tag = getattr(event, "tag", None)
        if tag not in (None, "!"):
            raise ParseError(f"YAML tags are not used in workflows (given '{tag}')", line, where, hint="remove the tag")
        if isinstance(event, yaml.ScalarEvent):
            self.scalar(event, line, where)
        else:
            self.open(event, line, where)


def compose(text: str, resolver: SafeLoader) -> tuple[yaml.Node | None, dict[Path_, int]]:
    """The node graph of ``text`` and the line of each key path, within the bounds above."""
    composer = _Composer(resolver)
    for event in _events(text):
        composer.feed(event)
    return (composer.root[0] if composer.root else None), composer.lines


def check_values(data: Any) -> list[tuple[Path_, str, str]]:
    """(path, message, hint) for each value a workflow cannot hold: NaN, infinities, integers
    beyond 64 bits, nesting beyond ``MAX_DEPTH``. Walks without recursion; the size is already
    bounded by the parser."""
    found: list[tuple[Path_, str, str]] = []
    stack: list[tuple[Any, Path_]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, (dict, list)) and len(path) >= MAX_DEPTH:
            found.append((path, f"nested deeper than {MAX_DEPTH} levels", "a workflow needs far fewer levels"))
        elif isinstance(value, dict):
            stack.extend((item, (*path, key)) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((item, (*path, index)) for index, item in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            found.append((path, f"{value} is not a usable number", "give a finite number"))
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_LIMIT:
            found.append((path, f"the integer {value} is out of range", "use a number below 2^63"))
    return found


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Parsing makes many small objects and no garbage cycles: the cyclic collector, left on,
    rescans them again and again (half the time of a 20,000-step file). Memory stays bounded by
    the file size limit and the alias bound."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def parse_yaml(text: str) -> Parsed:
    resolver = SafeLoader("")
    with _collector_paused():
        node, lines = compose(text, resolver)
        if node is None:
            return Parsed(data=None, lines=lines)
        try:
            data = resolver.construct_document(node)
        except (ValueError, TypeError, OverflowError) as error:  # a scalar the constructor cannot convert
            raise ParseError(f"cannot read a value: {error}") from None
    return Parsed(data=data, lines=lines)


def _line_of_text(text: str, needle: str) -> int | None:
    at = text.find(needle)
    return text.count("\n", 0, at) + 1 if at >= 0 else None


def parse_json(text: str) -> Parsed:
    """JSON by ``json``'s rules, with the same bounds as YAML."""
    try:
        with _collector_paused():
            _, lines = compose(text, SafeLoader(""))  # lines, depth, duplicate keys, with their lines
    except yaml.YAMLError:
        lines = {}  # JSON that YAML reads differently: json below still checks the bounds

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise ParseError(f"key '{key}' appears twice in one object", _line_of_text(text, f'"{key}"'))
            seen[key] = value
        return seen

    def bounded_int(digits: str) -> int:
        if len(digits) > MAX_INT_DIGITS:
            raise ParseError(f"an integer of {len(digits):,} digits", _line_of_text(text, digits), hint="use a number below 2^63")
        return int(digits)

    def no_constant(name: str) -> Any:
        raise ParseError(f"{name} is not a usable number", _line_of_text(text, name), hint="give a finite number")

    try:
        data = json.loads(text, object_pairs_hook=no_duplicates, parse_int=bounded_int, parse_constant=no_constant)
    except RecursionError:
        raise ParseError(
            f"nested deeper than {MAX_DEPTH} levels", _line_past_depth(text), hint="a workflow needs far fewer levels"
        ) from None
    return Parsed(data=data, lines=lines)


def _line_past_depth(text: str) -> int | None:
    """The line where JSON text first nests deeper than ``MAX_DEPTH`` (strings skipped)."""
    depth, line, in_string, escaped = 0, 1, False, False
    for char in text:
        if char == "\n":
            line += 1
        if in_string:
            escaped, in_string = (not escaped and char == "\\"), in_string and (escaped or char != '"')
            continue
        if char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return line
        elif char in "]}":
            depth -= 1
    return None
