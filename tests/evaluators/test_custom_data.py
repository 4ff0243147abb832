"""The custom data source: samples made by a function the workflow names, and its failures."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.errors import InputError
from evaluators.data.custom import Custom

MAKER = """
import numpy as np


def rows(model, n=4, length=6):
    ids = np.arange(n * length, dtype=np.int64).reshape(n, length) % 50
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def labelled(model, n=3):
    return {"x": np.zeros((n, 2), dtype=np.float32)}, np.arange(n)


def seen_model(model):
    return {"x": np.array([[len(model or "")]])}


def words(model):
    return "not samples"


def ragged(model):
    return {"a": np.zeros((2, 1)), "b": np.zeros((3, 1))}


def broken(model):
    return 1 / 0
"""


def _load(tmp_path, function, **options):
    file = tmp_path / "make_data.py"
    file.write_text(MAKER)
    source = Custom(Custom.Config(source="custom", file=str(file), function=function, options=options))
    return source.load(None)


def test_the_function_makes_the_samples_with_its_options(tmp_path):
    data = _load(tmp_path, "rows", n=5, length=7)
    assert len(data) == 5 and data.inputs["input_ids"].shape == (5, 7) and data.labels is None
    assert data.inputs["input_ids"][1, 0] == 7
    labelled = _load(tmp_path, "labelled")
    assert np.array_equal(labelled.labels, [0, 1, 2]) and labelled.inputs["x"].dtype == np.float32


@pytest.mark.parametrize(
    ("function", "says"),
    [
        ("missing", "'missing' is not defined in"),
        ("words", "returned str, not samples"),
        ("ragged", "inconsistent samples"),
        ("broken", "broken() failed: ZeroDivisionError"),
    ],
)
def test_a_bad_function_is_a_located_error(tmp_path, function, says):
    with pytest.raises(InputError) as caught:
        _load(tmp_path, function)
    (problem,) = caught.value.problems
    assert problem.where == "custom.function" and says in problem.message
    if function == "missing":
        assert "rows" in problem.message  # the functions the file defines are listed
