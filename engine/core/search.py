"""Search distributions: data that round-trips through JSON (the shape of optuna's); and the
sampler protocol: what proposes points of a search space and learns from what they measured."""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


def _check_range(low: float, high: float, log: bool) -> None:
    if low > high:
        raise ValueError(f"low {low} is above high {high}")
    if log and low <= 0:
        raise ValueError("a log-scale range needs low > 0")


class Distribution:
    kind: str

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def grid(self) -> Sequence[Any]:
        """The values a grid search visits (a lazy sequence: a range is never listed)."""
        raise NotImplementedError

    def size(self) -> int:
        """How many values ``grid`` holds, counted without listing them."""
        return len(self.grid())

    def contains(self, value: Any) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class Categorical(Distribution):
    choices: tuple[Any, ...]
    kind = "categorical"

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError("a categorical distribution needs at least one choice")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "choices": list(self.choices)}

    def grid(self) -> list[Any]:
        return list(self.choices)

    def contains(self, value: Any) -> bool:
        return value in self.choices


@dataclass(frozen=True)
class IntRange(Distribution):
    low: int
    high: int
    step: int = 1
    log: bool = False
    kind = "int"

    def __post_init__(self) -> None:
        _check_range(self.low, self.high, self.log)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "low": self.low, "high": self.high, "step": self.step, "log": self.log}

    def grid(self) -> range:
        return range(self.low, self.high + 1, self.step)

    def contains(self, value: Any) -> bool:
        return isinstance(value, int) and self.low <= value <= self.high and (value - self.low) % self.step == 0


@dataclass(frozen=True)
class FloatRange(Distribution):
    low: float
    high: float
    log: bool = False
    grid_points: int = 5
    kind = "float"

    def __post_init__(self) -> None:
        _check_range(self.low, self.high, self.log)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "low": self.low, "high": self.high, "log": self.log, "grid_points": self.grid_points}

    def grid(self) -> list[Any]:
        n = max(self.grid_points, 2)
        if self.log:
            a, b = math.log(self.low), math.log(self.high)
            return [math.exp(a + (b - a) * i / (n - 1)) for i in range(n)]
        return [self.low + (self.high - self.low) * i / (n - 1) for i in range(n)]

    def contains(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and self.low <= value <= self.high


def distribution_from_json(data: dict[str, Any]) -> Distribution:
    kind = data.get("kind")
    fields = {k: v for k, v in data.items() if k != "kind"}
    if kind == "categorical":
        return Categorical(tuple(fields["choices"]))
    if kind == "int":
        return IntRange(**fields)
    if kind == "float":
        return FloatRange(**fields)
    raise ValueError(f"unknown distribution kind {kind!r}; known: categorical, int, float")


@dataclass(frozen=True)
class SearchDim:
    """A searched option of a step: its distribution, active only ``when`` the step's other
    options have the given values (a list there means any of them)."""

    distribution: Distribution
    when: dict[str, Any] | None = None

    def active(self, values: dict[str, Any]) -> bool:
        for option, wanted in (self.when or {}).items():
            allowed = wanted if isinstance(wanted, list) else [wanted]
            if values.get(option) not in allowed:
                return False
        return True

    def to_json(self) -> dict[str, Any]:
        return {**self.distribution.to_json(), **({"when": self.when} if self.when else {})}


def distribution_from_spec(spec: Any) -> Distribution:
    """A workflow's search entry (a list, or {values | low, high, log, step}) as a distribution."""
    if isinstance(spec, list):
        return Categorical(tuple(spec))
    values = spec.get("values")
    if values is not None:
        return Categorical(tuple(values))
    low, high, step = spec["low"], spec["high"], spec.get("step")
    whole = all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)) and (step is None or isinstance(step, int))
    if whole:  # `low: 1, high: 64` is an integer range; `low: 0.5` or `low: 1.0` a float one
        return IntRange(int(low), int(high), int(step or 1), bool(spec.get("log", False)))
    return FloatRange(float(low), float(high), bool(spec.get("log", False)))


def ordered_dims(dims: dict[str, SearchDim]) -> list[str]:
    """Option names so that every option comes after the options its ``when`` names."""
    placed: list[str] = []
    pending = dict(dims)
    while pending:
        ready = [name for name, dim in pending.items() if all(k not in pending or k == name for k in (dim.when or {}))]
        if not ready:
            raise ValueError(f"the `when:` conditions of {', '.join(sorted(pending))} depend on each other in a circle")
        for name in ready:
            placed.append(name)
            del pending[name]
    return placed


def iter_grid_points(dims: dict[str, SearchDim], base: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every combination of the grid values of ``dims``, one at a time (the first option varies
    slowest), each option present only where its ``when`` holds (given ``base``, the step's fixed
    options, and the point so far). Nothing is listed: a range of 10^12 values costs nothing
    until its points are drawn."""
    order = ordered_dims(dims)

    def walk(at: int, point: dict[str, Any]) -> Iterator[dict[str, Any]]:
        if at == len(order):
            yield point
            return
        name = order[at]
        dim = dims[name]
        if not dim.active({**base, **point}):
            yield from walk(at + 1, point)
            return
        for value in dim.distribution.grid():
            yield from walk(at + 1, {**point, name: value})

    return walk(0, {})


def grid_points(dims: dict[str, SearchDim], base: dict[str, Any], limit: int | None = None) -> list[dict[str, Any]]:
    """The first ``limit`` (default: all) points of ``iter_grid_points``, as a list."""
    return list(itertools.islice(iter_grid_points(dims, base), limit))


class _Other:
    """A value of a conditioning option that no ``when:`` names (equal to none of them)."""


def grid_size(dims: dict[str, SearchDim], base: dict[str, Any]) -> int:
    """How many points ``iter_grid_points`` yields, counted by arithmetic: an option no ``when:``
    reads multiplies the count by its number of values; an option one reads is split into the
    values the conditions name and the others, which all count alike."""
    order = ordered_dims(dims)
    read = {option for dim in dims.values() for option in (dim.when or {})}
    named: dict[str, list[Any]] = {}
    for dim in dims.values():
        for option, wanted in (dim.when or {}).items():
            for value in wanted if isinstance(wanted, list) else [wanted]:
                if value not in named.setdefault(option, []):
                    named[option].append(value)

    def count(at: int, point: dict[str, Any]) -> int:
        if at == len(order):
            return 1
        name = order[at]
        dim = dims[name]
        if not dim.active({**base, **point}):
            return count(at + 1, point)
        values = dim.distribution.size()
        if name not in read:
            return values * count(at + 1, point)
        hits = [value for value in named.get(name, []) if value in dim.distribution.grid()]
        total = sum(count(at + 1, {**point, name: value}) for value in hits)
        others = values - len(hits)
        return total + (others * count(at + 1, {**point, name: _Other()}) if others > 0 else 0)

    return count(0, {})


# -- samplers -------------------------------------------------------------------------------------
class TrialState(enum.Enum):
    """How a proposed point ended, as a sampler is told it (the values are a candidate's states)."""

    COMPLETE = "complete"  # measured: the objective value is known
    FAILED = "failed"  # a job of the candidate failed, or the point is no candidate of the plan
    PRUNED = "pruned"  # not measured to the end: a shared job failed, or the objective was not reached


@dataclass(frozen=True)
class Trial:
    """A point of the search space. ``number`` is the sampler's own name for a point it proposed;
    None for a point it did not propose (a baseline), told so that it can learn from it too."""

    point: Mapping[str, Any]
    number: int | None = None


@dataclass(frozen=True)
class Outcome:
    """What a sampler learns of a trial, computed by the search: the state, the objective value
    (COMPLETE only; a timing is anchored on the reference's, so a busy minute does not read as a
    slow point) and each constraint's slack (<= 0: it holds)."""

    state: TrialState
    value: float | tuple[float, ...] | None = None  # a tuple: one value per objective, in order
    slacks: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.state is TrialState.COMPLETE) != (self.value is not None):
            raise ValueError(f"a {self.state.value} outcome {'needs' if self.value is None else 'has no'} objective value")

    @property
    def values(self) -> list[float] | None:
        """The objective values as a list (one per objective), None unless complete."""
        if self.value is None:
            return None
        return [float(v) for v in self.value] if isinstance(self.value, tuple) else [float(self.value)]


@runtime_checkable
class Sampler(Protocol):
    """Proposes the points of one target's search space: ``ask`` → the engine processes the point
    → ``tell``. The search calls, in order: ``tell`` for each baseline (a Trial with no number),
    ``resume`` once (the points earlier runs of the same search finished: processed again, from
    the cache, and not told), then ``ask``/``tell`` until its budget is spent or ``ask`` returns
    None; then ``close``."""

    #: consecutive asks that only found points processed before, after which the sampler is deemed
    #: exhausted; None: never (a sampler that proposes each point once)
    max_repeats: int | None
    #: (optional, read with ``getattr``; default False) True when ``ask`` never depends on what
    #: ``tell`` said, as a grid's: the search then asks for the next point as soon as a worker is
    #: free; otherwise it asks in waves of one point per worker, told whole before the next

    def resume(self) -> list[Trial]: ...

    def ask(self) -> Trial | None: ...

    def tell(self, trial: Trial, outcome: Outcome) -> None: ...

    def close(self) -> None: ...


# -- dotted option names (a target's searched settings: `cuda.enable_cuda_graph`) -------------------
def overlay(config: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with each dotted name in ``values`` set (``{"cuda.use_tf32": True}`` sets
    ``config["cuda"]["use_tf32"]``; a nested mapping that is missing or None is created)."""
    out: dict[str, Any] = {key: dict(value) if isinstance(value, Mapping) else value for key, value in config.items()}
    for name, value in values.items():
        *parents, leaf = name.split(".")
        node = out
        for part in parents:
            child = node.get(part)
            node[part] = dict(child) if isinstance(child, Mapping) else {}
            node = node[part]
        node[leaf] = value
    return out


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every option of ``config`` by its dotted name, nested mappings' options included (the
    mappings themselves too, under their own names)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        out[name] = value
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
    return out
