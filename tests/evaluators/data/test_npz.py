"""The npz data source: arrays by name, an input mapping, labels, and its errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.core.data import Dataset
from engine.core.errors import InputError
from evaluators.data.npz import Npz


def npz(path: Path, **options: object) -> Npz:
    return Npz(Npz.Config(source="npz", path=str(path), **options))


@pytest.fixture
def arrays(tmp_path: Path) -> Path:
    path = tmp_path / "arrays.npz"
    np.savez(path, pixels=np.arange(24, dtype=np.float32).reshape(4, 2, 3), mask=np.ones((4, 3), np.int64), y=np.array([0, 1, 1, 0]))
    return path


def test_every_array_but_the_labels_is_an_input_under_its_name(arrays: Path) -> None:
    data = npz(arrays, labels="y").load(None)
    assert set(data.inputs) == {"pixels", "mask"}
    assert data.inputs["pixels"].shape == (4, 2, 3) and data.inputs["pixels"].dtype == np.float32
    assert data.labels is not None and data.labels.tolist() == [0, 1, 1, 0]
    assert data.meta["labels"] == "y"
    assert data.meta["inputs"]["pixels"]["shape"] == [4, 2, 3]


def test_without_labels_every_array_is_an_input(arrays: Path) -> None:
    data = npz(arrays).load(None)
    assert set(data.inputs) == {"pixels", "mask", "y"}
    assert data.labels is None


def test_inputs_map_model_input_names_to_arrays(arrays: Path) -> None:
    data = npz(arrays, inputs={"pixel_values": "pixels"}, labels="y").load(None)
    assert list(data.inputs) == ["pixel_values"]
    assert data.meta["inputs"]["pixel_values"]["array"] == "pixels"


def test_compressed_archives_are_read(tmp_path: Path) -> None:
    path = tmp_path / "c.npz"
    np.savez_compressed(path, x=np.zeros((3, 2)))
    assert len(npz(path).load(None)) == 3


def test_a_dataset_file_written_by_kiln_keeps_its_labels(tmp_path: Path) -> None:
    Dataset(inputs={"x": np.zeros((2, 2))}, labels=np.array([1, 0]), meta={"a": 1}).save(tmp_path / "d.npz")
    data = npz(tmp_path / "d.npz").load(None)
    assert list(data.inputs) == ["x"]
    assert data.labels is not None and data.labels.tolist() == [1, 0]


def test_a_missing_array_names_the_arrays_and_suggests_one(arrays: Path) -> None:
    with pytest.raises(InputError, match="no array 'pixel'") as caught:
        npz(arrays, inputs={"input": "pixel"}).load(None)
    assert "pixels, mask, y" in str(caught.value)
    assert "did you mean 'pixels'" in str(caught.value)
    with pytest.raises(InputError, match=r"npz.labels"):
        npz(arrays, labels="label").load(None)


def test_different_sample_counts_are_an_input_error(tmp_path: Path) -> None:
    np.savez(tmp_path / "bad.npz", x=np.zeros((3, 2)), y=np.zeros(4))
    with pytest.raises(InputError, match="different sample counts") as caught:
        npz(tmp_path / "bad.npz", labels="y").load(None)
    assert "x: 3" in str(caught.value) and "y (labels): 4" in str(caught.value)


def test_a_scalar_array_is_an_input_error(tmp_path: Path) -> None:
    np.savez(tmp_path / "s.npz", x=np.zeros((3, 2)), scale=np.float32(2.0))
    with pytest.raises(InputError, match="scalar"):
        npz(tmp_path / "s.npz").load(None)


def test_no_samples_is_an_input_error(tmp_path: Path) -> None:
    np.savez(tmp_path / "e.npz", x=np.zeros((0, 2)))
    with pytest.raises(InputError, match="no samples"):
        npz(tmp_path / "e.npz").load(None)


def test_object_arrays_are_never_unpickled(tmp_path: Path) -> None:
    np.savez(tmp_path / "o.npz", x=np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(InputError, match="Python objects"):
        npz(tmp_path / "o.npz").load(None)


@pytest.mark.parametrize(("name", "match"), [("nowhere.npz", "does not exist"), ("junk.npz", "not a valid .npz"), ("one.npy", ".npy")])
def test_unreadable_files_are_input_errors(tmp_path: Path, name: str, match: str) -> None:
    (tmp_path / "junk.npz").write_bytes(b"not a zip archive")
    np.save(tmp_path / "one.npy", np.zeros(3))
    with pytest.raises(InputError, match=match):
        npz(tmp_path / name).load(None)
