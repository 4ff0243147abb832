"""Tables of samples: a CSV file (with a header row) or a JSON Lines file (one object per line).

Either a text column, tokenized with a Hugging Face tokenizer like ``text_lines``, or numeric
feature columns, stacked into one float32 input; an optional label column gives the labels
(integers as they are, other numbers as float64, strings mapped to class ids).

numpy comes with the SDK's data module; transformers is imported only when a text column is
tokenized (``_tokenize``), never at module import: the engine imports this module to read
``Config`` when it validates a workflow.
"""

from __future__ import annotations

import csv
import difflib
import json
import logging
import re
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from engine.core.data import Dataset, DataSource
from engine.core.errors import InputError
from engine.core.refs import FilePath
from evaluators.data._tokenize import TokenizedConfig, source_error, tokenize

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact
    from engine.core.target import TensorSpec

logger = logging.getLogger(__name__)

_INTEGER = re.compile(r"^[+-]?\d+$")


@dataclass
class Table:
    """Rows as read from the file: values by column name, with the file line of each row."""

    columns: list[str]
    rows: list[dict[str, Any]]
    lines: list[int]


class ColumnsConfig(TokenizedConfig):
    """Which columns of a table of samples make the inputs and the labels (a file's or a Hub dataset's)."""

    text_column: str | None = Field(
        default=None,
        description="The column holding text, tokenized with `tokenizer` into input_ids, attention_mask, ... Give this or `feature_columns`.",
    )
    feature_columns: list[str] | None = Field(
        default=None,
        min_length=1,
        description=(
            "Numeric columns stacked, in this order, into one float32 input [samples, features] named `input_name`. "
            "In JSON Lines a value may also be a list of numbers (flattened). Give this or `text_column`."
        ),
    )
    label_column: str | None = Field(
        default=None,
        description="The column holding each sample's label: integers are kept as class ids, other numbers as float64, strings mapped to ids (see `label_map`).",
    )
    label_map: dict[str, int] | None = Field(
        default=None,
        description="Label text → class id, e.g. {negative: 0, positive: 1}. Omit to number the distinct string labels 0..K-1 in sorted order (recorded in the dataset's meta).",
    )
    input_name: str = Field(default="input", description="The model input the feature columns feed (feature_columns only).")
    limit: int | None = Field(default=None, ge=1, description="Keep only the first N rows. Omit for all.")

    @model_validator(mode="after")
    def _one_kind_of_input(self) -> ColumnsConfig:
        kinds = {"`text_column` (text to tokenize)": self.text_column, "`feature_columns` (numbers)": self.feature_columns}
        if "image_column" in type(self).model_fields:  # a source that also reads images (hf_dataset)
            kinds["`image_column` (images)"] = getattr(self, "image_column", None)
        if sum(value is not None for value in kinds.values()) != 1:
            raise ValueError("give exactly one of " + " or ".join(kinds))
        if self.label_map is not None and self.label_column is None:
            raise ValueError("`label_map` needs `label_column`")
        if self.label_map is not None and any(value < 0 for value in self.label_map.values()):
            raise ValueError("`label_map` ids must be 0 or more")
        return self


class TabularConfig(ColumnsConfig):
    path: FilePath = Field(description="The file; relative paths are taken from the workflow's folder.")


class _Tabular(DataSource):
    """What CSV and JSON Lines share once the rows are read."""

    version = "1"
    libraries = ("transformers", "tokenizers")
    config: Any  # a TabularConfig, or another ColumnsConfig (hf_dataset)
    origin = ""  # where the rows were read (a file, a Hub dataset), for messages

    def error(self, where: str, message: str, **parts: str | None) -> InputError:
        return source_error(self.name, where, message, **parts)

    @abstractmethod
    def read_table(self, path: Path) -> Table:
        """Every row of the file, the header (or the keys seen) as ``columns``."""

    def load(self, input_model: ModelArtifact | None, signature: list[TensorSpec] | None = None) -> Dataset:
        path = Path(self.config.path)
        if not path.is_file():
            raise self.error(
                "path",
                "the file does not exist" if not path.exists() else "the path is not a file",
                given=str(path),
                hint="check the path (relative paths are taken from the workflow's folder)",
            )
        return self.from_table(self.read_table(path), input_model, str(path))

    def from_table(self, table: Table, input_model: ModelArtifact | None, origin: str) -> Dataset:
        """The dataset of a table's rows (``origin`` names where they were read, in meta and errors)."""
        cfg: ColumnsConfig = self.config
        self.origin = origin
        if cfg.limit is not None:
            table = Table(table.columns, table.rows[: cfg.limit], table.lines[: cfg.limit])
        if not table.rows:
            raise self.error("path", "the file holds no rows: no samples to read", given=origin, hint=self.format_hint())
        self._check_columns(table, origin)
        meta: dict[str, Any] = {"source": self.name, "path": origin, "samples": len(table.rows)}
        if cfg.text_column is not None:
            texts = [self._text(table, index, cfg.text_column) for index in range(len(table.rows))]
            inputs, tokenized = self.tokenized(table, texts, input_model, origin)
            meta.update(tokenized)
        else:
            assert cfg.feature_columns is not None
            inputs = {cfg.input_name: self._features(table, cfg.feature_columns)}
            meta["feature_columns"] = list(cfg.feature_columns)
        labels = None
        if cfg.label_column is not None:
            labels, label_meta = self._labels(table, cfg.label_column)
            meta.update(label_meta)
        meta["inputs"] = sorted(inputs)
        logger.debug("%s: %d samples from %s", self.name, len(table.rows), origin)
        return Dataset(inputs=inputs, labels=labels, meta=meta)

    def tokenized(
        self, table: Table, texts: list[str], input_model: ModelArtifact | None, origin: str
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The text column's samples tokenized (a source with more to say of its text overrides it)."""
        return tokenize(self.name, texts, self.config, input_model, origin)

    def format_hint(self) -> str:
        return "put one sample per row"

    # -- columns --------------------------------------------------------------------------------
    def _check_columns(self, table: Table, origin: str) -> None:
        cfg = self.config
        wanted = [("text_column", cfg.text_column), ("label_column", cfg.label_column)]
        wanted += [("feature_columns", name) for name in cfg.feature_columns or []]
        for option, column in wanted:
            if column is not None and column not in table.columns:
                close = difflib.get_close_matches(column, table.columns, n=1, cutoff=0.6)
                raise self.error(
                    option,
                    f"the file has no column '{column}'",
                    expected="one of: " + (", ".join(table.columns) or "(no columns)"),
                    given=column,
                    hint=f"did you mean '{close[0]}'?" if close else f"name a column of {Path(origin).name}",
                )

    def _where(self, table: Table, index: int) -> str:
        return f"row {index + 1} (line {table.lines[index]})"

    def _value(self, table: Table, index: int, column: str, option: str) -> Any:
        value = table.rows[index].get(column)
        if value is None or (isinstance(value, str) and not value.strip() and option != "text_column"):
            raise self.error(
                option,
                f"{self._where(table, index)} has no value for column '{column}'",
                given=self.origin,
                hint="fill in the value or drop the row",
            )
        return value

    def _text(self, table: Table, index: int, column: str) -> str:
        value = self._value(table, index, column, "text_column")
        if isinstance(value, (dict, list)):
            raise self.error("text_column", f"{self._where(table, index)}: column '{column}' holds {type(value).__name__}, not text")
        return value if isinstance(value, str) else str(value)

    def _features(self, table: Table, columns: list[str]) -> np.ndarray:
        rows: list[np.ndarray] = []
        for index in range(len(table.rows)):
            parts = []
            for column in columns:
                value = self._value(table, index, column, "feature_columns")
                vector = _numbers(value)
                if vector is None:
                    raise self.error(
                        "feature_columns",
                        f"{self._where(table, index)}: column '{column}' holds a value that is not a number",
                        expected="a number" + (" or a list of numbers" if self.name == "jsonl" else ""),
                        given=repr(value),
                        hint="fix the value, or leave the column out of feature_columns",
                    )
                parts.append(vector)
            row = np.concatenate(parts)
            if rows and len(row) != len(rows[0]):
                raise self.error(
                    "feature_columns",
                    f"{self._where(table, index)} has {len(row)} feature values but row 1 has {len(rows[0])}",
                    hint="give every row lists of the same length",
                )
            rows.append(row)
        return np.stack(rows).astype(np.float32)

    def _labels(self, table: Table, column: str) -> tuple[np.ndarray, dict[str, Any]]:
        values = [self._value(table, index, column, "label_column") for index in range(len(table.rows))]
        label_map = self.config.label_map
        if label_map is not None:
            keys = [value if isinstance(value, str) else json.dumps(value) for value in values]
            unknown = sorted({key for key in keys if key not in label_map})
            if unknown:
                raise self.error(
                    "label_map",
                    f"{len(unknown)} label value(s) of column '{column}' are not in label_map: {', '.join(map(repr, unknown[:10]))}",
                    expected="one of: " + ", ".join(map(repr, label_map)),
                    hint="add them to label_map, or omit label_map to number the labels in sorted order",
                )
            return np.asarray([label_map[key] for key in keys], dtype=np.int64), {"label_map": dict(label_map)}
        if all(_is_integer(value) for value in values):
            return np.asarray([int(value) for value in values], dtype=np.int64), {"label_kind": "integer"}
        numbers = [_numbers(value) for value in values]
        if all(vector is not None and len(vector) == 1 for vector in numbers):
            return np.asarray([float(vector[0]) for vector in numbers if vector is not None], dtype=np.float64), {"label_kind": "number"}
        texts = [value if isinstance(value, str) else json.dumps(value) for value in values]
        classes = sorted(set(texts))
        ids = {name: index for index, name in enumerate(classes)}
        return np.asarray([ids[text] for text in texts], dtype=np.int64), {"label_kind": "class", "label_map": ids, "classes": classes}


def _is_integer(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and bool(_INTEGER.match(value.strip()))


def _numbers(value: Any) -> np.ndarray | None:
    """A value as a flat float64 vector, or None when it is not numeric."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return np.asarray([value], dtype=np.float64)
    if isinstance(value, str):
        try:
            return np.asarray([float(value.strip())], dtype=np.float64)
        except ValueError:
            return None
    if isinstance(value, list):
        if any(isinstance(item, (bool, str, dict)) for item in value):
            return None
        try:
            return np.asarray(value, dtype=np.float64).ravel()
        except (TypeError, ValueError):
            return None
    return None


class Csv(_Tabular):
    name = "csv"
    summary = "Rows of a CSV file with a header: a text column (tokenized) or numeric feature columns, plus an optional label column."

    class Config(TabularConfig):
        source: Literal["csv"] = Field(description="Reads the rows of a CSV file whose first row names the columns.")
        delimiter: str = Field(default=",", min_length=1, max_length=1, description="The character between fields (`;`, a tab, ...).")

    config: Config

    def read_table(self, path: Path) -> Table:
        try:
            # utf-8-sig: a byte-order mark that spreadsheet programs write is not part of the first name
            with open(path, encoding="utf-8-sig", newline="") as handle:
                reader = csv.DictReader(handle, delimiter=self.config.delimiter)
                columns = list(reader.fieldnames or [])
                rows, lines = [], []
                for row in reader:
                    rows.append(row)
                    lines.append(reader.line_num)
        except UnicodeDecodeError as error:
            raise self.error("path", f"the file is not UTF-8 text ({error})", given=str(path)) from error
        except csv.Error as error:
            raise self.error("path", f"the file is not valid CSV: {error}", given=str(path)) from error
        if not columns:
            raise self.error("path", "the file is empty: no header row and no samples", given=str(path), hint=self.format_hint())
        return Table(columns=columns, rows=rows, lines=lines)

    def format_hint(self) -> str:
        return "write a header row naming the columns, then one sample per row"


class JsonLines(_Tabular):
    name = "jsonl"
    summary = "One JSON object per line: a text field (tokenized) or numeric feature fields, plus an optional label field."

    class Config(TabularConfig):
        source: Literal["jsonl"] = Field(description="Reads one JSON object per line of a file (blank lines are skipped).")

    config: Config

    def read_table(self, path: Path) -> Table:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise self.error("path", f"the file is not UTF-8 text ({error})", given=str(path)) from error
        columns: dict[str, None] = {}
        rows, lines = [], []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise self.error(
                    "path", f"line {number} is not valid JSON: {error.msg}", given=line[:80], hint="write one JSON object per line"
                ) from error
            if not isinstance(row, dict):
                raise self.error("path", f"line {number} holds a JSON {type(row).__name__}, not an object", given=line[:80])
            columns.update(dict.fromkeys(row))
            rows.append(row)
            lines.append(number)
        return Table(columns=list(columns), rows=rows, lines=lines)

    def format_hint(self) -> str:
        return 'write one JSON object per line, e.g. {"text": "...", "label": "positive"}'
