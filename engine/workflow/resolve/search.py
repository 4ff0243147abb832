"""A step's ``search:``: each option a distribution, every grid point a valid config."""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from engine import registry
from engine.core.errors import Problem
from engine.core.search import SearchDim, distribution_from_spec, flatten, grid_points, overlay
from engine.workflow.problems import TYPE_ERRORS, expected_value, problems_from_validation
from engine.workflow.resolve.plugins import Where
from engine.workflow.schema import SearchOption
from engine.workflow.source import WorkflowSource

GRID_CHECK_LIMIT = 4096  # points of one step's grid checked against its Config at validation


def _unknown_option(option: str, fields: list[str], owner: str, source: WorkflowSource, at: Where, verb: str) -> Problem:
    close = registry.suggest(option, fields)
    return source.problem(
        at,
        f"{owner} has no option '{option}' to {verb}",
        expected="one of: " + ", ".join(fields) if verb == "search" else None,
        given=option,
        hint=f"did you mean '{close}'?" if close else None,
    )


def _leaf_types(annotation: Any) -> set[Any]:
    """The types an annotation admits (``int | None`` -> {int, NoneType}; Annotated unwrapped)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return {type(arg) for arg in args}
    if not args or isinstance(annotation, type):
        return {annotation}
    return {leaf for arg in args for leaf in _leaf_types(arg)}


def _annotation(model: Any, option: str) -> Any:
    """The annotation of a dotted option of a pydantic model, or None when unknown."""
    *parents, leaf = option.split(".")
    for part in parents:
        info = getattr(model, "model_fields", {}).get(part)
        kinds = [k for k in _leaf_types(info.annotation) if isinstance(k, type) and issubclass(k, BaseModel)] if info else []
        if not kinds:
            return None
        model = kinds[0]
    info = getattr(model, "model_fields", {}).get(leaf)
    return info.annotation if info is not None else None


def _range_problem(model: Any, option: str, spec: dict[str, Any], source: WorkflowSource, at: Where) -> Problem | None:
    """A range on an option that holds no number (a bool, a choice of names) is refused."""
    annotation = _annotation(model, option)
    if annotation is None or annotation is Any:
        return None
    kinds = _leaf_types(annotation)
    if (int in kinds or float in kinds) and bool not in kinds:
        return None
    shown = " | ".join(sorted(getattr(k, "__name__", str(k)) for k in kinds))
    return source.problem(
        at,
        f"a range (low, high) searches numbers, and option '{option}' holds {shown}",
        expected="a list of values, e.g. [false, true]" if bool in kinds else "a list of values",
        given=f"low: {spec.get('low')!r}, high: {spec.get('high')!r}",
        hint=f"list the values to search: `{option}: [..]`",
    )


def _duplicate_problem(values: list[Any], source: WorkflowSource, at: Where) -> Problem | None:
    """A value listed twice would be a second, identical point: refused, naming it."""
    seen: list[Any] = []
    for value in values:
        if any(type(value) is type(other) and value == other for other in seen):
            count = sum(1 for other in values if type(value) is type(other) and value == other)
            return source.problem(
                at,
                f"the value {value!r} is listed {count} times",
                expected="each value once",
                given=f"{len(values)} values",
                hint=f"list {value!r} once",
            )
        seen.append(value)
    return None


def _dimension(
    option: str, spec: Any, fields: list[str], owner: str, source: WorkflowSource, at: Where, model: Any = None
) -> tuple[SearchDim | None, list[Problem]]:
    """One searched option as a distribution (and its condition), or None and the problems."""
    if isinstance(spec, list):
        if not spec:
            return None, [source.problem(at, "a searched option needs at least one value", given="[]")]
        duplicate = _duplicate_problem(spec, source, at)
        if duplicate is not None:
            return None, [duplicate]
        return SearchDim(distribution_from_spec(spec), None), []
    if not isinstance(spec, dict):
        message = "a searched option is a list of values or {values | low, high, log, step, when}"
        return None, [source.problem(at, message, given=repr(spec))]
    try:
        SearchOption(**spec)
    except ValidationError as error:
        return None, problems_from_validation(error, source, at, SearchOption, f"the search of option '{option}'")
    if isinstance(spec.get("values"), list):
        duplicate = _duplicate_problem(spec["values"], source, (*at, "values"))
        if duplicate is not None:
            return None, [duplicate]
    elif model is not None:
        wrong = _range_problem(model, option, spec, source, at)
        if wrong is not None:
            return None, [wrong]
    when = spec.get("when")
    problems = [
        _unknown_option(name, fields, owner, source, (*at, "when", name), "condition on") for name in when or {} if name not in fields
    ]
    return SearchDim(distribution_from_spec(spec), when), problems


def _invalid_points(
    cls: Any,
    config: dict[str, Any],
    dims: dict[str, SearchDim],
    source: WorkflowSource,
    where: Where,
    owner: str,
    build: Any = None,
    base: dict[str, Any] | None = None,
    what: str = "point",
) -> list[Problem]:
    """One problem per option whose searched values make a config the plugin refuses. ``build``
    makes the config of a point (default: the point's options over ``config``); ``base`` is what
    ``when:`` conditions read (default: ``config``)."""
    try:
        points = grid_points(dims, config if base is None else base, limit=GRID_CHECK_LIMIT)
    except ValueError as error:
        return [source.problem((*where, "search"), str(error))]
    problems: list[Problem] = []
    reported: set[str] = set()
    for point in points:
        try:
            cls.Config(**(build(point) if build is not None else {**config, **point}))
        except TypeError as error:  # a plugin's own check met a value of a type it did not expect
            problems.append(source.problem((*where, "search"), f"the searched {what} is not a valid config of {owner}: {error}"))
            break
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            loc = [str(part) for part in first["loc"]]
            # the searched option the error is in: the longest dotted prefix of its location
            option = next((".".join(loc[:i]) for i in range(len(loc), 0, -1) if ".".join(loc[:i]) in dims), ".".join(loc))
            if option in reported:
                continue
            reported.add(option)
            shown = ", ".join(f"{k}={v!r}" for k, v in point.items())
            expected = expected_value(first["type"], first.get("ctx") or {})
            if first["type"] in TYPE_ERRORS:
                kind = expected or "of the option's type"
                hint = f"each searched value of '{option}' must be {kind}: fix or remove the others"
            else:
                hint = "narrow the values, or make the option conditional with `when:`"
            problems.append(
                source.problem(
                    (*where, "search", *([option] if option in dims else [])),
                    f"the searched {what} ({shown}) {'is' if what == 'point' else 'are'} not a valid config of {owner}: {first['msg']}",
                    expected=expected,
                    given=repr(point.get(option)) if option in point else None,
                    hint=hint,
                )
            )
    return problems


def resolve_search(
    cls: Any, config: dict[str, Any] | None, raw: Any, source: WorkflowSource, where: Where, owner: str, problems: list[Problem]
) -> dict[str, SearchDim]:
    """A step's ``search:`` as distributions; every grid point is checked against the pass's
    Config, so "static needs a calibration dataset" is caught before anything runs."""
    if not isinstance(raw, dict):
        return {}
    dims = _dimensions(raw, list(cls.Config.model_fields), owner, source, where, problems, cls.Config)
    if config is not None and dims:
        problems.extend(_invalid_points(cls, config, dims, source, where, owner))
    return dims


def _dimensions(
    raw: dict[str, Any], fields: list[str], owner: str, source: WorkflowSource, where: Where, problems: list[Problem], model: Any = None
) -> dict[str, SearchDim]:
    """Each searched option of ``raw`` that names one of ``fields`` as a distribution."""
    dims: dict[str, SearchDim] = {}
    for option, spec in raw.items():
        at = (*where, "search", option)
        if option not in fields:
            problems.append(_unknown_option(option, fields, owner, source, at, "search"))
            continue
        dim, found = _dimension(option, spec, fields, owner, source, at, model)
        problems.extend(found)
        if dim is not None:
            dims[option] = dim
    return dims


#: target options that are never searched: what names the target and where it runs
UNSEARCHED_TARGET_OPTIONS = ("id", "runtime", "device", "environment", "resources", "placement")


def option_names(model: Any, prefix: str = "", depth: int = 2) -> list[str]:
    """The options of a pydantic model by dotted name: its fields, and the fields of fields
    typed as another model (``cuda.enable_cuda_graph``), ``depth`` levels down."""
    names: list[str] = []
    for name, info in model.model_fields.items():
        names.append(f"{prefix}{name}")
        if depth <= 1:
            continue
        for kind in (info.annotation, *typing.get_args(info.annotation)):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                names.extend(option_names(kind, f"{prefix}{name}.", depth - 1))
    return names


def resolve_target_search(
    cls: Any, options: dict[str, Any], raw: Any, source: WorkflowSource, where: Where, owner: str, problems: list[Problem]
) -> dict[str, SearchDim]:
    """A target's ``search:``: its session settings (threads, provider options, ...) as
    distributions, named by dotted option names; every grid point is checked against the
    target's Config, so a value the runtime refuses is caught before anything runs."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(
            source.problem((*where, "search"), "a target's search is a mapping", expected="{option: [values]}", given=repr(raw))
        )
        return {}
    fields = [name for name in option_names(cls.Config) if name.split(".")[0] not in UNSEARCHED_TARGET_OPTIONS]
    searchable: dict[str, Any] = {}
    for option, spec in raw.items():
        if option.split(".")[0] in UNSEARCHED_TARGET_OPTIONS:
            problems.append(
                source.problem(
                    (*where, "search", option),
                    f"{owner}'s option '{option}' names the target and cannot be searched",
                    expected="a session setting: " + ", ".join(fields[:12]) + (", ..." if len(fields) > 12 else ""),
                    given=option,
                    hint="declare one target per device or runtime instead",
                )
            )
        else:
            searchable[option] = spec
    dims = _dimensions(searchable, fields, owner, source, where, problems, cls.Config)
    if dims:
        problems.extend(
            _invalid_points(
                cls,
                options,
                dims,
                source,
                where,
                owner,
                build=lambda point: overlay(options, point),
                base=flatten(options),
                what="settings",
            )
        )
    return dims
