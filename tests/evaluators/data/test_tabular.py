"""The csv and jsonl data sources: feature columns, text columns, labels, and their errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pydantic
import pytest

from engine.core.errors import InputError
from engine.core.refs import RefKind, reference_fields, references
from evaluators.data.tabular import Csv, JsonLines

CSV_TEXT = "text,a,b,label\nthe cat sat,1.5,2,cat\na dog ran,0,-1,dog\nthe mat,3,4e-1,cat\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def csv_source(path: Path, **options: object) -> Csv:
    return Csv(Csv.Config(source="csv", path=str(path), **options))


def jsonl_source(path: Path, **options: object) -> JsonLines:
    return JsonLines(JsonLines.Config(source="jsonl", path=str(path), **options))


def jsonl_file(tmp_path: Path, rows: list[dict[str, object]], name: str = "rows.jsonl") -> Path:
    return write(tmp_path, name, "\n".join(json.dumps(row) for row in rows) + "\n")


def test_csv_feature_columns_become_one_float32_input(tmp_path: Path) -> None:
    data = csv_source(write(tmp_path, "t.csv", CSV_TEXT), feature_columns=["a", "b"], input_name="features").load(None)
    assert list(data.inputs) == ["features"]
    array = data.inputs["features"]
    assert array.dtype == np.float32
    np.testing.assert_allclose(array, [[1.5, 2.0], [0.0, -1.0], [3.0, 0.4]], rtol=1e-6)
    assert data.labels is None
    assert data.meta["feature_columns"] == ["a", "b"]


def test_string_labels_are_numbered_in_sorted_order_and_recorded(tmp_path: Path) -> None:
    data = csv_source(write(tmp_path, "t.csv", CSV_TEXT), feature_columns=["a"], label_column="label").load(None)
    assert data.labels is not None
    assert data.labels.tolist() == [0, 1, 0]
    assert data.labels.dtype == np.int64
    assert data.meta["label_map"] == {"cat": 0, "dog": 1}
    assert data.meta["classes"] == ["cat", "dog"]


def test_a_label_map_gives_the_ids(tmp_path: Path) -> None:
    data = csv_source(write(tmp_path, "t.csv", CSV_TEXT), feature_columns=["a"], label_column="label", label_map={"dog": 0, "cat": 7}).load(
        None
    )
    assert data.labels is not None and data.labels.tolist() == [7, 0, 7]
    assert data.meta["label_map"] == {"dog": 0, "cat": 7}


def test_a_label_outside_the_label_map_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not in label_map") as caught:
        csv_source(write(tmp_path, "t.csv", CSV_TEXT), feature_columns=["a"], label_column="label", label_map={"cat": 0}).load(None)
    assert "'dog'" in str(caught.value)


def test_integer_labels_are_kept_and_other_numbers_stay_numbers(tmp_path: Path) -> None:
    ints = jsonl_source(jsonl_file(tmp_path, [{"x": 1, "y": 2}, {"x": 2, "y": 0}]), feature_columns=["x"], label_column="y").load(None)
    assert ints.labels is not None and ints.labels.tolist() == [2, 0] and ints.labels.dtype == np.int64
    path = write(tmp_path, "r.csv", "x,y\n1,0.5\n2,1.25\n")
    floats = csv_source(path, feature_columns=["x"], label_column="y").load(None)
    assert floats.labels is not None and floats.labels.tolist() == [0.5, 1.25]


def test_jsonl_accepts_lists_of_numbers_and_skips_blank_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "r.jsonl", '{"v": [1, 2], "w": 3, "label": "b"}\n\n{"v": [4, 5], "w": 6, "label": "a"}\n')
    data = jsonl_source(path, feature_columns=["v", "w"], label_column="label").load(None)
    assert data.inputs["input"].tolist() == [[1, 2, 3], [4, 5, 6]]
    assert data.labels is not None and data.labels.tolist() == [1, 0]


def test_a_missing_column_names_the_columns_and_suggests_one(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no column 'lable'") as caught:
        csv_source(write(tmp_path, "t.csv", CSV_TEXT), feature_columns=["a"], label_column="lable").load(None)
    text = str(caught.value)
    assert "text, a, b, label" in text
    assert "did you mean 'label'" in text
    assert "csv.label_column" in text


def test_a_non_numeric_feature_names_the_row_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "a,b\n1,2\n3,four\n")
    with pytest.raises(InputError, match="row 2 \\(line 3\\)") as caught:
        csv_source(path, feature_columns=["a", "b"]).load(None)
    assert "'four'" in str(caught.value) and "column 'b'" in str(caught.value)


def test_an_empty_value_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="row 1 \\(line 2\\) has no value for column 'b'"):
        csv_source(write(tmp_path, "t.csv", "a,b\n1,\n"), feature_columns=["a", "b"]).load(None)


def test_lists_of_different_lengths_are_an_input_error(tmp_path: Path) -> None:
    path = jsonl_file(tmp_path, [{"v": [1, 2]}, {"v": [1]}])
    with pytest.raises(InputError, match="1 feature values but row 1 has 2"):
        jsonl_source(path, feature_columns=["v"]).load(None)


@pytest.mark.parametrize(("name", "text"), [("e.csv", ""), ("h.csv", "a,b\n"), ("e.jsonl", ""), ("b.jsonl", "\n \n")])
def test_an_empty_file_is_an_input_error(tmp_path: Path, name: str, text: str) -> None:
    path = write(tmp_path, name, text)
    source = csv_source(path, feature_columns=["a"]) if name.endswith(".csv") else jsonl_source(path, feature_columns=["a"])
    with pytest.raises(InputError, match=r"empty|no rows"):
        source.load(None)


def test_a_missing_file_is_an_input_error_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist") as caught:
        csv_source(tmp_path / "nowhere.csv", feature_columns=["a"]).load(None)
    assert str(tmp_path / "nowhere.csv") in str(caught.value)


def test_bad_json_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="line 2 is not valid JSON"):
        jsonl_source(write(tmp_path, "r.jsonl", '{"a": 1}\n{"a": \n'), feature_columns=["a"]).load(None)
    with pytest.raises(InputError, match="line 1 holds a JSON list"):
        jsonl_source(write(tmp_path, "l.jsonl", "[1, 2]\n"), feature_columns=["a"]).load(None)


def test_a_jsonl_row_without_the_column_is_named(tmp_path: Path) -> None:
    path = jsonl_file(tmp_path, [{"a": 1, "y": 0}, {"a": 2}])
    with pytest.raises(InputError, match="row 2 \\(line 2\\) has no value for column 'y'"):
        jsonl_source(path, feature_columns=["a"], label_column="y").load(None)


def test_delimiter_limit_and_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "semi.csv"
    path.write_bytes("\ufeffa;b\n1;2\n3;4\n5;6\n".encode())
    data = csv_source(path, feature_columns=["a", "b"], delimiter=";", limit=2).load(None)
    assert data.inputs["input"].tolist() == [[1, 2], [3, 4]]


def test_a_text_column_is_tokenized_like_text_lines(tmp_path: Path, tokenizer_dir: Path) -> None:
    path = write(tmp_path, "t.csv", CSV_TEXT)
    data = csv_source(path, text_column="text", label_column="label", tokenizer=str(tokenizer_dir), max_length=8).load(None)
    assert set(data.inputs) == {"input_ids", "attention_mask", "token_type_ids"}
    assert data.inputs["input_ids"].shape == (3, 8)
    # vocabulary: [PAD] [UNK] [CLS] [SEP] [MASK] the cat sat on a mat dog ran far away
    assert data.inputs["input_ids"][0, :5].tolist() == [2, 5, 6, 7, 3]
    assert data.labels is not None and data.labels.tolist() == [0, 1, 0]
    assert data.meta["sequence_length"] == 8


def test_jsonl_text_column_with_longest_padding(tmp_path: Path, tokenizer_dir: Path) -> None:
    path = jsonl_file(tmp_path, [{"t": "the cat"}, {"t": "a dog ran far away"}])
    data = jsonl_source(path, text_column="t", tokenizer=str(tokenizer_dir), padding="longest").load(None)
    assert data.inputs["input_ids"].shape == (2, 7)


def test_config_needs_exactly_one_kind_of_input(tmp_path: Path) -> None:
    with pytest.raises(pydantic.ValidationError, match="exactly one"):
        csv_source(tmp_path / "t.csv")
    with pytest.raises(pydantic.ValidationError, match="exactly one"):
        csv_source(tmp_path / "t.csv", text_column="t", feature_columns=["a"])
    with pytest.raises(pydantic.ValidationError, match="label_column"):
        csv_source(tmp_path / "t.csv", feature_columns=["a"], label_map={"x": 0})
    with pytest.raises(pydantic.ValidationError):
        jsonl_source(tmp_path / "t.jsonl", feature_columns=["a"], delimiter=";")  # csv only
    assert sorted(references(Csv.Config)[RefKind.FILE]) == ["path", "tokenizer"] and reference_fields(Csv.Config)[
        "tokenizer"
    ].sentinels == ("input",)
