"""Custom: samples made by a function in a Python file the workflow names.

This runs code from that file where the dataset is read, by design: the workflow's author named
it (``file`` and ``function`` are in the workflow, and `engine plan` shows them). The engine makes
the path absolute, checks it exists and hashes its content into the dataset's key, so editing
the file reads the data again. ``engine import-olive`` turns an Olive data config's user_script
into this source, naming the function it would call.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from engine.core.data import RESERVED_NAMES, Dataset, DataSource, DataSourceConfig
from engine.core.errors import EvaluationError
from engine.core.refs import CodePath
from evaluators._usercode import describe_exception, load_function
from evaluators.data._tokenize import source_error

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact
    from engine.core.target import TensorSpec

RETURNS = (
    "{input name: array, ...} (first axis the sample), a pair ({input name: array}, labels), an engine.core.data.Dataset, "
    "or a sequence of samples, each {input name: array} or ({input name: array}, label) (a torch Dataset, as Olive's data "
    "functions return)"
)


class Custom(DataSource):
    name = "custom"
    summary = "Samples made by a function from a Python file the workflow names (runs code from that file)."
    version = "1"

    class Config(DataSourceConfig):
        source: Literal["custom"] = Field(description="Samples made by a function of a Python file (its code runs where the data is read).")
        file: CodePath = Field(description="The Python file defining the function; relative paths start at the workflow's folder.")
        function: str = Field(
            description=(
                "The function to call: function(model, **options), `model` the input model's path (None for none), returning "
                + RETURNS
                + "."
            )
        )
        options: dict[str, Any] = Field(
            default_factory=dict, description="Keyword arguments passed to the function as they are (part of the dataset's key)."
        )

    config: Config

    def load(self, input_model: ModelArtifact | None, signature: list[TensorSpec] | None = None) -> Dataset:
        config = self.config
        try:
            function = load_function(config.file, config.function, "file")
        except EvaluationError as error:
            raise source_error(self.name, "function", str(error), given=f"{config.file}:{config.function}") from error
        model = str(input_model.path) if input_model is not None else None
        try:
            made = function(model, **config.options)
        except Exception as error:  # any error in user code is reported, with where it happened
            path = Path(inspect.getfile(function))
            raise source_error(
                self.name, "function", f"{config.function}() failed: {describe_exception(error, path)}", given=config.file
            ) from error
        return self._dataset(made)

    def _stacked(self, samples: Any) -> Any:
        """A sequence of samples (``{name: array}`` or ``({name: array}, label)``) stacked into arrays."""
        import numpy as np

        rows: list[dict[str, Any]] = []
        labels: list[Any] = []
        for index in range(len(samples)):
            item = samples[index]
            if isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], dict):
                item, label = item
                labels.append(np.asarray(label))
            if not isinstance(item, dict) or not item:
                raise source_error(
                    self.name, "function", f"sample {index} of {self.config.function}() is {type(item).__name__}", expected=RETURNS
                )
            rows.append({str(name): np.asarray(value) for name, value in item.items()})
        if not rows or any(row.keys() != rows[0].keys() for row in rows):
            raise source_error(self.name, "function", f"{self.config.function}() returned no samples, or samples with different inputs")
        try:
            stacked = {name: np.stack([row[name] for row in rows]) for name in rows[0]}
        except ValueError as error:
            raise source_error(self.name, "function", f"{self.config.function}() returned samples of different shapes: {error}") from error
        return (stacked, np.stack(labels)) if len(labels) == len(rows) else stacked

    def _dataset(self, made: Any) -> Dataset:
        import numpy as np

        if isinstance(made, Dataset):
            return made
        if not isinstance(made, dict | tuple | str | bytes) and hasattr(made, "__len__") and hasattr(made, "__getitem__"):
            made = self._stacked(made)
        labels = None
        if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], dict):
            made, labels = made
        if not isinstance(made, dict) or not made or not all(isinstance(k, str) for k in made):
            raise source_error(
                self.name,
                "function",
                f"{self.config.function}() returned {type(made).__name__}, not samples",
                expected=RETURNS,
                given=repr(made)[:120],
            )
        reserved = sorted(set(made) & set(RESERVED_NAMES))
        if reserved:
            raise source_error(self.name, "function", f"input names {reserved} are reserved", hint="rename those inputs")
        try:
            return Dataset(
                inputs={name: np.asarray(value) for name, value in made.items()}, labels=None if labels is None else np.asarray(labels)
            )
        except ValueError as error:
            raise source_error(self.name, "function", f"{self.config.function}() returned inconsistent samples: {error}") from error
