"""Models as content-addressed artifacts."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from engine.core.hashing import digest_tree

log = logging.getLogger(__name__)

#: The formats Kiln knows, and the file inside an artifact folder that a runtime opens (None: the
#: folder itself). Plugins add theirs with ``register_format`` or the ``kiln.formats`` entry points.
FORMATS: dict[str, str | None] = {
    "hf": None,  # a Hugging Face folder: config.json + weights (+ tokenizer)
    "torch": None,  # a PyTorch module made by a factory function; the folder holds factory.json
    "onnx": "model.onnx",
    "openvino": "model.xml",
    # a decoder with a key/value cache, in the folder ONNX Runtime GenAI opens: genai_config.json,
    # the tokenizer's files, model.onnx (+ its external data)
    "genai": "model.onnx",
    # a model split into parts run in sequence: model_0.onnx, model_1.onnx... and split.json, the
    # manifest naming the parts in order with their inputs and outputs (+ genai_config.json and
    # the tokenizer's files when the parts are a genai decoder's pipeline)
    "onnx_parts": "split.json",
    # an encoder-decoder model with a key/value cache: encoder.onnx (source -> encoder states and
    # cross-attention keys / values) and decoder.onnx (one step over the cache), seq2seq.json
    # naming them with their inputs and outputs, config.json (+ the tokenizer's files)
    "seq2seq": "seq2seq.json",
}

#: the entry-point group a plugin package lists its formats under: ``name = "module:FORMAT"``,
#: where ``FORMAT`` is an ``ArtifactFormat`` (read in every process, workers included)
ENTRY_POINT_GROUP = "kiln.formats"


@dataclass(frozen=True)
class ArtifactFormat:
    """A model format: its name (what passes declare in ``accepts``/``produces``) and the file in an
    artifact folder that a runtime opens (``model.engine`` for a TensorRT plan; None: the folder)."""

    name: str
    model_file: str | None = None


def register_format(name: str, model_file: str | None = None) -> ArtifactFormat:
    """Make ``name`` a model format. A plugin whose pass produces a new format (a native runtime's
    plan, say) calls this where the pass is defined, or lists it under ``kiln.formats``.
    Registering a known format again with the same file is a no-op; with another, an error."""
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"a format name is letters, digits, '_' and '-', not {name!r}")
    if name in FORMATS and FORMATS[name] != model_file:
        raise ValueError(f"format {name!r} is registered with model file {FORMATS[name]!r}, not {model_file!r}")
    FORMATS[name] = model_file
    return ArtifactFormat(name, model_file)


_entry_points_read = False


def _read_entry_points() -> None:
    global _entry_points_read
    _entry_points_read = True
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            value = entry.load()
            register_format(value.name, value.model_file)
        except Exception as error:  # noqa: BLE001 - a broken plugin must not take the known formats down
            log.warning("model format %s (%s) cannot be registered: %s", entry.name, entry.value, error)


def known_format(name: str) -> bool:
    """Whether ``name`` is a registered format (entry points are read the first time one is not)."""
    if name not in FORMATS and not _entry_points_read:
        _read_entry_points()
    return name in FORMATS


@dataclass(frozen=True)
class ModelArtifact:
    """A model in one format, stored as a folder (or, for the input, wherever the user keeps it).

    ``digest`` is the sha256 of the folder's manifest plus the format (see ``hashing.digest_tree``);
    ``attrs`` carries what downstream steps need to know and is not part of the digest (for
    instance the folder of the tokenizer the model was exported with).
    """

    format: str
    path: Path
    digest: str
    attrs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not known_format(self.format):
            raise ValueError(f"unknown model format {self.format!r}; known: {', '.join(FORMATS)}")

    @classmethod
    def from_folder(cls, format: str, path: Path, attrs: dict[str, Any] | None = None) -> ModelArtifact:
        path = Path(path)
        return cls(format=format, path=path, digest=digest_tree(path, format), attrs=dict(attrs or {}))

    @property
    def model_file(self) -> Path:
        """The file a runtime opens (``model.onnx``, ``model.xml``); the folder for folder formats."""
        name = FORMATS[self.format]
        if name is None or self.path.is_file():
            return self.path
        return self.path / name

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "path": str(self.path), "digest": self.digest, "attrs": self.attrs}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelArtifact:
        return cls(format=data["format"], path=Path(data["path"]), digest=data["digest"], attrs=dict(data.get("attrs") or {}))
