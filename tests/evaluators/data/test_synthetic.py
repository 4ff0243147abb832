"""The synthetic data source: shapes from a signature, deterministic for a seed."""

from __future__ import annotations

import numpy as np
import pydantic
import pytest

from engine.core.errors import InputError
from engine.core.target import TensorSpec
from evaluators.data.synthetic import Synthetic

SIGNATURE = [
    TensorSpec("input_ids", "int64", ("batch", "sequence")),
    TensorSpec("attention_mask", "int64", ("batch", "sequence")),
    TensorSpec("token_type_ids", "int64", ("batch", "sequence")),
    TensorSpec("pixel_values", "float32", ("batch", 3, "height", "width")),
]


def synthetic(**options: object) -> Synthetic:
    return Synthetic(Synthetic.Config(source="synthetic", **options))


def test_arrays_have_samples_rows_and_resolved_dims() -> None:
    data = synthetic(samples=5, sequence_length=12, dims={"height": 4, "width": 6}).load(None, SIGNATURE)
    assert len(data) == 5
    assert data.inputs["input_ids"].shape == (5, 12)
    assert data.inputs["pixel_values"].shape == (5, 3, 4, 6)
    assert data.inputs["input_ids"].dtype == np.int64
    assert data.inputs["pixel_values"].dtype == np.float32
    assert data.meta["shapes"]["input_ids"] == [5, 12]


def test_masks_are_ones_type_ids_zeros_and_ids_below_int_high() -> None:
    data = synthetic(samples=8, sequence_length=16, int_high=7).load(None, SIGNATURE)
    assert (data.inputs["attention_mask"] == 1).all()
    assert (data.inputs["token_type_ids"] == 0).all()
    ids = data.inputs["input_ids"]
    assert ids.min() >= 0 and ids.max() < 7
    assert len(np.unique(ids)) > 1


def test_the_same_seed_gives_the_same_data_and_another_seed_differs() -> None:
    first = synthetic(seed=3).load(None, SIGNATURE)
    again = synthetic(seed=3).load(None, SIGNATURE)
    other = synthetic(seed=4).load(None, SIGNATURE)
    for name in first.inputs:
        np.testing.assert_array_equal(first.inputs[name], again.inputs[name])
    assert not np.array_equal(first.inputs["input_ids"], other.inputs["input_ids"])
    assert not np.array_equal(first.inputs["pixel_values"], other.inputs["pixel_values"])


def test_a_static_batch_axis_still_gives_one_row_per_sample() -> None:
    data = synthetic(samples=4).load(None, [TensorSpec("input_ids", "int64", (1, 16))])
    assert data.inputs["input_ids"].shape == (4, 16)
    batch = next(data.batches(1))
    assert batch["input_ids"].shape == (1, 16)  # what the model's static batch takes


def test_without_a_signature_it_is_an_input_error() -> None:
    assert Synthetic.needs_signature
    with pytest.raises(InputError, match="signature"):
        synthetic().load(None, None)


def test_a_scalar_input_is_an_input_error_naming_it() -> None:
    with pytest.raises(InputError, match="temperature"):
        synthetic().load(None, [TensorSpec("temperature", "float32", ())])


def test_config_rejects_zero_samples_and_unknown_keys() -> None:
    with pytest.raises(pydantic.ValidationError):
        synthetic(samples=0)
    with pytest.raises(pydantic.ValidationError):
        synthetic(rows=3)
