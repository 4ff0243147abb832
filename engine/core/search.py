"""Search distributions: data that round-trips through JSON (the shape of optuna's)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class Distribution:
    kind: str

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def grid(self) -> list[Any]:
        """The values a grid search visits."""
        raise NotImplementedError

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
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")
        if self.log and self.low <= 0:
            raise ValueError("a log-scale range needs low > 0")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "low": self.low, "high": self.high, "step": self.step, "log": self.log}

    def grid(self) -> list[Any]:
        return list(range(self.low, self.high + 1, self.step))

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
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")
        if self.log and self.low <= 0:
            raise ValueError("a log-scale range needs low > 0")

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
