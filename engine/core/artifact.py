"""Models as content-addressed artifacts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.hashing import digest_tree

#: The formats Kiln knows, and the file inside an artifact folder that a runtime opens.
FORMATS: dict[str, str | None] = {
    "hf": None,  # a Hugging Face folder: config.json + weights (+ tokenizer)
    "torch": None,  # a PyTorch module made by a factory function; the folder holds factory.json
    "onnx": "model.onnx",
    "openvino": "model.xml",
}


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
        if self.format not in FORMATS:
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
