"""The sklearn data source: the bundled datasets, reshaped and scaled."""

from __future__ import annotations

import numpy as np
import pydantic
import pytest

from engine.core.errors import InputError
from evaluators.data.sklearn import Sklearn

pytest.importorskip("sklearn")


def sklearn(**options: object) -> Sklearn:
    return Sklearn(Sklearn.Config(source="sklearn", **options))


@pytest.mark.parametrize(
    ("name", "samples", "features", "classes"),
    [("digits", 1797, 64, 10), ("iris", 150, 4, 3), ("wine", 178, 13, 3), ("breast_cancer", 569, 30, 2)],
)
def test_each_dataset_loads_with_labels(name: str, samples: int, features: int, classes: int) -> None:
    data = sklearn(name=name).load(None)
    assert data.inputs["input"].shape == (samples, features)
    assert data.inputs["input"].dtype == np.float32
    assert data.labels is not None and data.labels.dtype == np.int64
    assert sorted(set(data.labels.tolist())) == list(range(classes))
    assert len(data.meta["classes"]) == classes


def test_digits_reshaped_and_scaled_for_a_cnn() -> None:
    data = sklearn(name="digits", reshape=[1, 8, 8], scale=1 / 16, input_name="image", dtype="float64").load(None)
    images = data.inputs["image"]
    assert images.shape == (1797, 1, 8, 8)
    assert images.dtype == np.float64
    assert images.max() == 1.0 and images.min() == 0.0
    assert data.meta["shape"] == [1, 8, 8]


def test_a_reshape_of_the_wrong_size_is_an_input_error() -> None:
    with pytest.raises(InputError, match="4 features per sample") as caught:
        sklearn(name="iris", reshape=[3]).load(None)
    assert "sklearn.reshape" in str(caught.value)


def test_only_bundled_datasets_are_accepted() -> None:
    with pytest.raises(pydantic.ValidationError):
        sklearn(name="mnist_784")
