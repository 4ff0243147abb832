"""Datasets: named inputs (and optional labels) that calibration and evaluators share.

A dataset is materialized once from its source (a text file, a CSV, ...) into arrays, stored in
the artifact store as ``dataset.npz`` and keyed by the digest of its source files and options.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from engine.core.config import StrictConfig
from engine.core.errors import InputError, Problem

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact
    from engine.core.target import TensorSpec

_LABELS = "__labels__"
#: the reserved array holding ``Dataset.meta`` as a JSON string
_META = "__meta__"
RESERVED_NAMES = (_LABELS, _META)


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

    def select(self, indices: np.ndarray | list[int]) -> Dataset:
        """The samples at ``indices`` (in that order), labels kept aligned; meta is copied."""
        index = np.asarray(indices, dtype=np.int64)
        return Dataset(
            inputs={name: array[index] for name, array in self.inputs.items()},
            labels=None if self.labels is None else self.labels[index],
            meta=dict(self.meta),
        )

    def apply_split(self, split: Split | None) -> Dataset:
        """The part of this dataset that ``split`` names (itself when ``split`` is None); the
        split and the sample counts are recorded in ``meta["split"]``."""
        if split is None:
            return self
        total = len(self)
        chosen = self.select(split.indices(total))
        chosen.meta["split"] = {**split.to_json(), "samples": len(chosen), "of": total}
        return chosen

    def save(self, path: Path) -> None:
        clash = sorted(set(self.inputs) & set(RESERVED_NAMES))
        if clash:
            raise ValueError(f"input name(s) {', '.join(clash)} are reserved by the dataset file format")
        arrays = dict(self.inputs)
        if self.labels is not None:
            arrays[_LABELS] = self.labels
        arrays[_META] = np.asarray(json.dumps(self.meta, sort_keys=True, default=_json_value))
        with open(path, "wb") as handle:
            np.savez(handle, allow_pickle=False, **arrays)

    @classmethod
    def load(cls, path: Path) -> Dataset:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
        labels = arrays.pop(_LABELS, None)
        meta_text = arrays.pop(_META, None)
        meta = json.loads(str(meta_text)) if meta_text is not None else {}
        return cls(inputs=arrays, labels=labels, meta=meta)


def _json_value(value: Any) -> Any:
    """numpy scalars and arrays as Python values in a dataset's meta; anything else as text."""
    to_list = getattr(value, "tolist", None)
    return to_list() if callable(to_list) else str(value)


class Split(StrictConfig):
    """Which part of a dataset to keep. ``complement: true`` keeps exactly the other samples, so
    two datasets over the same source (calibration and evaluation, say) never overlap."""

    take: Literal["first", "last", "range", "fraction"] = Field(
        description=(
            "`first`: the first `count` samples in the source's order; `last`: the last `count`; "
            "`range`: the `count` samples from index `start` on (between a `first` and a `last` split of the "
            "same source, say); `fraction`: a random `fraction` of the samples drawn with `seed`, kept in the "
            "source's order."
        )
    )
    count: int | None = Field(default=None, ge=1, description="How many samples `first`, `last` and `range` take; not used by `fraction`.")
    start: int | None = Field(default=None, ge=0, description="The index (from 0) of the first sample `range` takes; only for `range`.")
    fraction: float | None = Field(
        default=None, gt=0.0, lt=1.0, description="The share of samples `fraction` takes, in (0, 1); rounded to the nearest count."
    )
    seed: int = Field(
        default=0,
        description="Seed of the random draw of `fraction`: the same seed and sample count always give the same samples.",
    )
    complement: bool = Field(
        default=False,
        description=(
            "Keep every sample the split does NOT take instead: `{take: first, count: 100}` and "
            "`{take: first, count: 100, complement: true}` are disjoint and together cover the dataset."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> Split:
        if (self.take == "range") != (self.start is not None):
            raise ValueError("take: range needs `start` (an index from 0); `start` is only for take: range")
        if self.take == "fraction":
            if self.fraction is None or self.count is not None:
                raise ValueError("take: fraction needs `fraction` (in (0, 1)) and no `count`")
        elif self.count is None or self.fraction is not None:
            raise ValueError(f"take: {self.take} needs `count` (a positive integer) and no `fraction`")
        return self

    def taken(self, total: int) -> np.ndarray:
        """Sorted indices of the samples the split takes (before ``complement``)."""
        if self.take == "fraction":
            assert self.fraction is not None
            count = round(self.fraction * total)
            order = np.random.default_rng(self.seed).permutation(total)
            return np.sort(order[:count])
        assert self.count is not None
        if self.take == "range":
            assert self.start is not None
            return np.arange(self.start, min(self.start + self.count, total))
        count = min(self.count, total)
        return np.arange(count) if self.take == "first" else np.arange(total - count, total)

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Every field, but `start` only where it is set: it came after splits' keys were first
        recorded, and a split written before it keeps its key (and its cached datasets)."""
        doc: dict[str, Any] = handler(self)
        if doc.get("start") is None:
            doc.pop("start", None)
        return doc

    def indices(self, total: int) -> np.ndarray:
        """Sorted indices of the samples kept out of ``total``; an empty part is an InputError."""
        end = (self.start or 0) + (self.count or 0)
        if self.take != "fraction" and end > total:
            took = f"samples {self.start} to {end - 1}" if self.take == "range" else f"the {self.take} {self.count} samples"
            raise InputError(
                [
                    Problem(
                        where="split.count",
                        message=f"the split takes {took} but the dataset has only {total}",
                        expected=f"a {'start + count' if self.take == 'range' else 'count'} of at most {total}",
                        given=str(end if self.take == "range" else self.count),
                        hint="lower `count`" + (" or `start`" if self.take == "range" else ", or use `take: fraction`"),
                    )
                ]
            )
        taken = self.taken(total)
        if not self.complement:
            kept = taken
        else:
            mask = np.ones(total, dtype=bool)
            mask[taken] = False
            kept = np.flatnonzero(mask)
        if len(kept) == 0:
            part = "complement of the split" if self.complement else "split"
            raise InputError(
                [
                    Problem(
                        where="split",
                        message=f"the {part} keeps no sample of the dataset's {total}",
                        given=json.dumps(self.to_json()),
                        hint="take fewer samples (for a complement) or more (for the split itself)",
                    )
                ]
            )
        return kept


class DataSourceConfig(StrictConfig):
    source: str = Field(description="Which data source reads this dataset.")
    split: Split | None = Field(
        default=None,
        description=(
            "Keep only part of the samples, after the source has read them: {take: first|last, count: N}, "
            "{take: range, start: I, count: N} or "
            "{take: fraction, fraction: 0.2, seed: 0}; add `complement: true` for exactly the other samples "
            "(e.g. calibration = first 100, evaluation = the complement of the same split). Omit for all samples."
        ),
    )


class DataSource(ABC):
    """Reads a dataset from somewhere a user keeps data. One module per source."""

    name: ClassVar[str]
    summary: ClassVar[str]
    version: ClassVar[str] = "1"
    Config: ClassVar[type[DataSourceConfig]] = DataSourceConfig
    libraries: ClassVar[tuple[str, ...]] = ()
    #: how long reading the dataset may take (a dataset has no ``timeout_s`` of its own)
    default_timeout_s: ClassVar[float] = 3600.0
    # Options that hold a path are typed ``FilePath`` (or ``FileOrInput``): resolved against the
    # workflow's folder and hashed by content; see ``engine.core.refs``.
    #: the source is built from the consuming model's input signature (synthetic data): it is
    #: materialized where the model is at hand instead of once ahead of the run
    needs_signature: ClassVar[bool] = False
    #: the source reads a Hugging Face Hub dataset its config names (``name``, ``revision``): before the
    #: run the engine finds it in the Hub cache and sets the config's ``commit`` (recorded in
    #: workflow.lock.json) and ``folder`` (the snapshot, whose files enter the dataset's key)
    hub_dataset: ClassVar[bool] = False

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
