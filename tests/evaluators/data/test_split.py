"""Splits of a dataset: first / last / seeded fraction, complements disjoint and covering; meta
kept through save and load; the worker applies a source's split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pydantic
import pytest

from engine.core.data import Dataset, Split
from engine.core.errors import InputError
from engine.core.target import TensorSpec
from evaluators.data.npz import Npz
from evaluators.data.synthetic import Synthetic


def numbered(count: int = 10) -> Dataset:
    """Sample i holds i in every input and as its label, so selections are easy to read."""
    ids = np.arange(count)
    return Dataset(inputs={"x": ids.astype(np.float32)[:, None] * [1, 1], "y": ids.copy()}, labels=ids * 10, meta={"source": "test"})


def split(**options: object) -> Split:
    return Split(**options)  # type: ignore[arg-type]


def test_first_and_last_take_counts_in_order() -> None:
    data = numbered()
    assert data.apply_split(split(take="first", count=3)).inputs["y"].tolist() == [0, 1, 2]
    assert data.apply_split(split(take="last", count=3)).inputs["y"].tolist() == [7, 8, 9]
    assert data.apply_split(split(take="first", count=3, complement=True)).inputs["y"].tolist() == [3, 4, 5, 6, 7, 8, 9]
    assert data.apply_split(split(take="last", count=3, complement=True)).inputs["y"].tolist() == list(range(7))


@pytest.mark.parametrize(
    "options",
    [
        {"take": "first", "count": 4},
        {"take": "last", "count": 1},
        {"take": "fraction", "fraction": 0.3, "seed": 0},
        {"take": "fraction", "fraction": 0.7, "seed": 42},
    ],
)
def test_a_split_and_its_complement_are_disjoint_and_cover_the_dataset(options: dict[str, object]) -> None:
    data = numbered(20)
    part = data.apply_split(split(**options)).inputs["y"]
    rest = data.apply_split(split(**options, complement=True)).inputs["y"]
    assert not set(part) & set(rest)
    assert sorted([*part, *rest]) == list(range(20))


def test_labels_and_every_input_stay_aligned() -> None:
    part = numbered(20).apply_split(split(take="fraction", fraction=0.5, seed=3))
    assert part.labels is not None
    assert (part.labels == part.inputs["y"] * 10).all()
    assert (part.inputs["x"][:, 0] == part.inputs["y"]).all()


def test_a_fraction_is_deterministic_for_a_seed_and_keeps_the_source_order() -> None:
    first = numbered(50).apply_split(split(take="fraction", fraction=0.2, seed=7)).inputs["y"]
    again = numbered(50).apply_split(split(take="fraction", fraction=0.2, seed=7)).inputs["y"]
    other = numbered(50).apply_split(split(take="fraction", fraction=0.2, seed=8)).inputs["y"]
    assert first.tolist() == again.tolist()
    assert first.tolist() != other.tolist()
    assert len(first) == 10
    assert first.tolist() == sorted(first.tolist())
    assert first.tolist() != list(range(10))  # random, not the head


def test_the_split_is_recorded_in_meta() -> None:
    part = numbered(10).apply_split(split(take="first", count=4))
    assert part.meta["split"]["take"] == "first"
    assert part.meta["split"]["samples"] == 4
    assert part.meta["split"]["of"] == 10
    assert part.meta["source"] == "test"


def test_no_split_is_the_dataset_itself() -> None:
    data = numbered()
    assert data.apply_split(None) is data


def test_select_picks_indices_in_order_with_labels() -> None:
    picked = numbered().select([5, 1])
    assert picked.inputs["y"].tolist() == [5, 1]
    assert picked.labels is not None and picked.labels.tolist() == [50, 10]


def test_a_count_above_the_dataset_size_is_an_input_error() -> None:
    with pytest.raises(InputError, match="only 10") as caught:
        numbered(10).apply_split(split(take="first", count=11))
    assert "split.count" in str(caught.value)


def test_an_empty_part_is_an_input_error() -> None:
    with pytest.raises(InputError, match="keeps no sample"):
        numbered(10).apply_split(split(take="first", count=10, complement=True))
    with pytest.raises(InputError, match="keeps no sample"):
        numbered(3).apply_split(split(take="fraction", fraction=0.1))


@pytest.mark.parametrize(
    "options",
    [
        {"take": "first"},
        {"take": "first", "count": 2, "fraction": 0.5},
        {"take": "fraction"},
        {"take": "fraction", "fraction": 1.0},
        {"take": "fraction", "fraction": 0.5, "count": 3},
        {"take": "middle", "count": 3},
        {"take": "first", "count": 0},
        {"take": "first", "count": 2, "shuffle": True},
    ],
)
def test_inconsistent_splits_are_rejected(options: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError):
        split(**options)


def test_every_source_config_takes_a_split() -> None:
    config = Npz.Config(source="npz", path="x.npz", split={"take": "last", "count": 2})  # type: ignore[arg-type]
    assert config.split == Split(take="last", count=2)
    assert config.to_json()["split"]["complement"] is False
    assert Npz.Config(source="npz", path="x.npz").split is None


def test_meta_survives_save_and_load(tmp_path: Path) -> None:
    data = numbered(6).apply_split(split(take="first", count=4))
    data.meta["classes"] = ["a", "b"]
    data.meta["count"] = np.int64(3)  # numpy scalars become plain numbers
    data.save(tmp_path / "d.npz")
    loaded = Dataset.load(tmp_path / "d.npz")
    assert loaded.meta["split"]["samples"] == 4
    assert loaded.meta["classes"] == ["a", "b"]
    assert loaded.meta["count"] == 3
    assert set(loaded.inputs) == {"x", "y"}
    assert loaded.labels is not None and loaded.labels.tolist() == [0, 10, 20, 30]


def test_a_file_without_meta_loads_with_empty_meta(tmp_path: Path) -> None:
    np.savez(tmp_path / "old.npz", x=np.zeros((2, 3)), __labels__=np.array([0, 1]))
    loaded = Dataset.load(tmp_path / "old.npz")
    assert loaded.meta == {}
    assert loaded.labels is not None


def test_reserved_input_names_cannot_be_saved(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="reserved"):
        Dataset(inputs={"__meta__": np.zeros(2)}).save(tmp_path / "d.npz")


def test_the_worker_applies_the_split_after_loading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.execute.worker import run_dataset
    from engine.plan.jobs import WorkOrder
    from engine.store.store import Store

    monkeypatch.chdir(tmp_path)  # the worker changes directory; this puts it back afterwards

    source = tmp_path / "arrays.npz"
    np.savez(source, x=np.arange(10, dtype=np.float32)[:, None], y=np.arange(10))
    store = Store(tmp_path / "store").ensure()
    staging = tmp_path / "staging"
    staging.mkdir()
    job = WorkOrder(
        kind="dataset",
        key="k" * 64,
        key_doc={},
        plugin="npz",
        config={"source": "npz", "path": str(source), "labels": "y", "split": {"take": "first", "count": 3, "complement": True}},
        staging=str(staging),
    )
    record = run_dataset(job, store)
    assert record["samples"] == 7
    saved = Dataset.load(store.object_path(record["digest"]) / "dataset.npz")
    assert saved.labels is not None and saved.labels.tolist() == [3, 4, 5, 6, 7, 8, 9]
    assert saved.meta["split"]["complement"] is True
    assert saved.meta["source"] == "npz"


def test_the_worker_splits_signature_sources_too() -> None:
    from engine.execute.worker import _dataset_loaders
    from engine.plan.jobs import DatasetInput, WorkOrder

    spec = DatasetInput(source="synthetic", config={"source": "synthetic", "samples": 10, "split": {"take": "last", "count": 4}})
    order = WorkOrder(kind="eval", key="k" * 64, key_doc={}, plugin="fidelity", config={}, datasets={"s": spec})
    loaders = _dataset_loaders(order, None, lambda: [TensorSpec("x", "float32", ("batch", 2))])
    data = loaders["s"]()
    whole = Synthetic(Synthetic.Config(source="synthetic", samples=10)).load(None, [TensorSpec("x", "float32", ("batch", 2))])
    assert len(data) == 4
    assert np.array_equal(data.inputs["x"], whole.inputs["x"][6:])
    assert json.loads(json.dumps(data.meta))["split"]["take"] == "last"


def test_a_range_takes_count_samples_from_start_and_its_complement_the_rest() -> None:
    data = numbered(10)
    assert data.apply_split(split(take="range", start=3, count=4)).inputs["y"].tolist() == [3, 4, 5, 6]
    assert data.apply_split(split(take="range", start=3, count=4, complement=True)).inputs["y"].tolist() == [0, 1, 2, 7, 8, 9]
    # between a `first` and a `last` split of the same source, overlapping neither
    head = set(data.apply_split(split(take="first", count=3)).inputs["y"])
    tail = set(data.apply_split(split(take="last", count=3)).inputs["y"])
    assert not (head | tail) & set(data.apply_split(split(take="range", start=3, count=4)).inputs["y"])


def test_a_range_past_the_end_names_the_samples_it_wanted() -> None:
    with pytest.raises(InputError, match="samples 8 to 11 but the dataset has only 10") as caught:
        numbered(10).apply_split(split(take="range", start=8, count=4))
    assert "start" in str(caught.value)


@pytest.mark.parametrize(
    "options", [{"take": "range", "count": 3}, {"take": "first", "count": 3, "start": 2}, {"take": "range", "start": -1, "count": 2}]
)
def test_start_belongs_to_range_alone(options: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError):
        split(**options)


def test_a_split_without_start_keeps_the_key_document_it_had() -> None:
    """`start` came later: splits written before it dump (and so key) exactly as they did."""
    config = Npz.Config(source="npz", path="x.npz", split={"take": "first", "count": 2})  # type: ignore[arg-type]
    assert config.to_json()["split"] == {"take": "first", "count": 2, "fraction": None, "seed": 0, "complement": False}
    ranged = Npz.Config(source="npz", path="x.npz", split={"take": "range", "start": 4, "count": 2})  # type: ignore[arg-type]
    assert ranged.to_json()["split"]["start"] == 4
