"""Datasets: named inputs (and optional labels) that calibration and evaluators share.

A dataset is materialized once from its source (a text file, a CSV, ...) into arrays, stored in
the artifact store as ``dataset.npz`` and keyed by the digest of its source files and options.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from pydantic import Field

from engine.core.config import StrictConfig

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact
    from engine.core.target import TensorSpec

_LABELS = "__labels__"


@dataclass
class Dataset:
    """Inputs by name, each an array whose first axis is the sample; labels optional."""

    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sizes = {name: len(array) for name, array in self.inputs.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"inputs have different sample counts: {sizes}")
        if self.labels is not None and sizes and len(self.labels) != next(iter(sizes.values())):
            raise ValueError(f"{len(self.labels)} labels for {next(iter(sizes.values()))} samples")

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values()))) if self.inputs else 0

    def batches(self, batch_size: int = 1, limit: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        count = len(self) if limit is None else min(limit, len(self))
        for start in range(0, count, batch_size):
            stop = min(start + batch_size, count)
            yield {name: array[start:stop] for name, array in self.inputs.items()}

    def save(self, path: Path) -> None:
        arrays = dict(self.inputs)
        if self.labels is not None:
            arrays[_LABELS] = self.labels
        with open(path, "wb") as handle:
            np.savez(handle, allow_pickle=False, **arrays)

    @classmethod
    def load(cls, path: Path) -> Dataset:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
        labels = arrays.pop(_LABELS, None)
        return cls(inputs=arrays, labels=labels)


class DataSourceConfig(StrictConfig):
    source: str = Field(description="Which data source reads this dataset.")


class DataSource(ABC):
    """Reads a dataset from somewhere a user keeps data. One module per source."""

    name: ClassVar[str]
    summary: ClassVar[str]
    version: ClassVar[str] = "1"
    Config: ClassVar[type[DataSourceConfig]] = DataSourceConfig
    libraries: ClassVar[tuple[str, ...]] = ()
    #: option names that hold a path, resolved against the workflow's folder and hashed by content
    path_options: ClassVar[tuple[str, ...]] = ()
    #: values of path options that name something other than a path (``tokenizer: input``)
    path_sentinels: ClassVar[tuple[str, ...]] = ()
    #: the source is built from the consuming model's input signature (synthetic data): it is
    #: materialized where the model is at hand instead of once ahead of the run
    needs_signature: ClassVar[bool] = False

    def __init__(self, config: DataSourceConfig) -> None:
        self.config = config

    @abstractmethod
    def load(self, input_model: ModelArtifact | None, signature: list[TensorSpec] | None = None) -> Dataset:
        """Read the data. ``input_model`` is the workflow's input model (its tokenizer, say);
        ``signature`` the consuming model's inputs, given when ``needs_signature`` is set."""


# --- synthetic feeds from a signature ----------------------------------------------------------

_SEQUENCE_NAMES = re.compile(r"seq|len|token|position", re.IGNORECASE)


def resolve_shape(spec: TensorSpec, batch_size: int, sequence_length: int, dims: dict[str, int] | None = None) -> tuple[int, ...]:
    """Concrete shape for a tensor whose dims may be symbolic: named dims from ``dims`` first,
    then the first axis is the batch and any other unknown axis the sequence length."""
    dims = dims or {}
    shape = []
    for axis, dim in enumerate(spec.shape):
        if isinstance(dim, int) and dim > 0:
            shape.append(dim)
        elif isinstance(dim, str) and dim in dims:
            shape.append(dims[dim])
        elif axis == 0:
            shape.append(batch_size)
        else:
            shape.append(sequence_length)
    return tuple(shape)


def synthetic_feeds(
    specs: list[TensorSpec],
    batch_size: int,
    sequence_length: int,
    seed: int = 0,
    dims: dict[str, int] | None = None,
    int_high: int = 1000,
) -> dict[str, np.ndarray]:
    """Inputs of the right names, dtypes and shapes: masks are ones, type ids zeros, other integer
    inputs uniform in [0, int_high), floats standard normal. Deterministic for a seed."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = resolve_shape(spec, batch_size, sequence_length, dims)
        dtype = np.dtype(spec.dtype)
        lowered = spec.name.lower()
        if dtype.kind in "iu":
            if "mask" in lowered:
                feeds[spec.name] = np.ones(shape, dtype=dtype)
            elif "type" in lowered or "segment" in lowered:
                feeds[spec.name] = np.zeros(shape, dtype=dtype)
            else:
                feeds[spec.name] = rng.integers(0, int_high, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec.name] = np.ones(shape, dtype=dtype)
        else:
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
    return feeds
