"""Arrays saved with ``numpy.savez``: each array one model input (or the labels), first axis the sample.

numpy comes with the SDK's data module; nothing heavier is imported.
"""

from __future__ import annotations

import difflib
import logging
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from engine.core.data import RESERVED_NAMES, Dataset, DataSource, DataSourceConfig
from engine.core.refs import FilePath
from evaluators.data._tokenize import source_error

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact
    from engine.core.target import TensorSpec

logger = logging.getLogger(__name__)

#: what a dataset file written by Kiln itself names its labels
_KILN_LABELS = "__labels__"


class Npz(DataSource):
    name = "npz"
    summary = "Arrays of a numpy .npz archive, one per model input (first axis the sample), plus an optional labels array."
    version = "1"

    class Config(DataSourceConfig):
        source: Literal["npz"] = Field(description="Reads the arrays of a numpy .npz archive (numpy.savez / savez_compressed).")
        path: FilePath = Field(description="The .npz file; relative paths are taken from the workflow's folder.")
        inputs: dict[str, str] | None = Field(
            default=None,
            description=(
                "Model input name → name of the array in the file that feeds it, e.g. {pixel_values: x}. "
                "Omit to feed every array, under its own name, except the labels array."
            ),
        )
        labels: str | None = Field(
            default=None,
            description="The array holding each sample's label (first axis the sample). Omit for no labels (a file Kiln wrote keeps its own).",
        )

    config: Config

    def _error(self, where: str, message: str, **parts: str | None) -> Any:
        return source_error(self.name, where, message, **parts)

    def _read(self, path: Path) -> dict[str, np.ndarray]:
        if not path.is_file():
            raise self._error(
                "path",
                "the file does not exist" if not path.exists() else "the path is not a file",
                given=str(path),
                hint="check the path (relative paths are taken from the workflow's folder)",
            )
        try:
            loaded = np.load(path, allow_pickle=False)
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as error:
            # numpy takes a file that is neither a zip nor a .npy for a pickle, which it refuses to read
            raise self._error(
                "path", f"the file is not a valid .npz archive ({error})", given=str(path), hint="save with numpy.savez"
            ) from error
        if isinstance(loaded, np.ndarray):
            raise self._error(
                "path", "the file holds a single array (.npy), not an .npz archive", given=str(path), hint="save with numpy.savez"
            )
        with loaded as archive:
            try:
                return {name: archive[name] for name in archive.files}
            except ValueError as error:  # an object array: np.load refuses to unpickle it
                raise self._error(
                    "path",
                    f"the archive holds an array of Python objects, which is never unpickled ({error})",
                    given=str(path),
                    hint="save plain numeric arrays with numpy.savez",
                ) from error
            except (OSError, zipfile.BadZipFile, EOFError) as error:
                raise self._error("path", f"the archive is damaged: {error}", given=str(path)) from error

    def _array(self, arrays: dict[str, np.ndarray], name: str, option: str, path: Path) -> np.ndarray:
        if name not in arrays:
            names = [n for n in arrays if n not in RESERVED_NAMES]
            close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
            raise self._error(
                option,
                f"the file holds no array '{name}'",
                expected="one of: " + (", ".join(names) or "(no arrays)"),
                given=name,
                hint=f"did you mean '{close[0]}'?" if close else f"name an array of {path.name}",
            )
        array = arrays[name]
        if array.ndim == 0:
            raise self._error(
                option,
                f"array '{name}' is a scalar: it has no sample axis",
                given=str(path),
                hint="save arrays whose first axis is the sample",
            )
        return array

    def load(self, input_model: ModelArtifact | None, signature: list[TensorSpec] | None = None) -> Dataset:
        cfg = self.config
        path = Path(cfg.path)
        arrays = self._read(path)
        label_name = cfg.labels if cfg.labels is not None else (_KILN_LABELS if _KILN_LABELS in arrays else None)
        labels = self._array(arrays, label_name, "labels", path) if label_name is not None else None
        if cfg.inputs is not None:
            inputs = {model_input: self._array(arrays, name, "inputs", path) for model_input, name in cfg.inputs.items()}
        else:
            inputs = {
                name: self._array(arrays, name, "inputs", path) for name in arrays if name != label_name and name not in RESERVED_NAMES
            }
        if not inputs:
            raise self._error("path", "the file holds no input arrays", given=str(path), hint="save at least one array besides the labels")
        counts = {name: len(array) for name, array in inputs.items()}
        if labels is not None:
            counts[f"{label_name} (labels)"] = len(labels)
        if len(set(counts.values())) > 1:
            shown = ", ".join(f"{name}: {count}" for name, count in counts.items())
            raise self._error(
                "path",
                f"the arrays have different sample counts along their first axis ({shown})",
                given=str(path),
                hint="save arrays with the same number of samples",
            )
        if next(iter(counts.values())) == 0:
            raise self._error("path", "the arrays hold no samples (their first axis is 0)", given=str(path))
        meta = {
            "source": self.name,
            "path": str(path),
            "samples": len(next(iter(inputs.values()))),
            "inputs": {
                name: {"array": cfg.inputs[name] if cfg.inputs else name, "shape": list(a.shape), "dtype": str(a.dtype)}
                for name, a in inputs.items()
            },
            "labels": label_name,
        }
        logger.debug("npz: %d samples, inputs %s, from %s", meta["samples"], ", ".join(inputs), path)
        return Dataset(inputs=inputs, labels=labels, meta=meta)
