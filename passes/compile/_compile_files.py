"""Which ONNX files of an artifact ``ort_compile`` compiles, and the rest of the folder copied.

- ``onnx``: its ``model.onnx``.
- ``genai`` (a decoder folder, a static one's prefill and generation models included): every ONNX
  model genai_config.json names (the decoder's ``filename``, each pipeline stage's), else every
  ``.onnx`` of the folder. Each compiled model keeps its file name, so genai_config.json stays as
  it is and still names the models ONNX Runtime GenAI opens.
- ``onnx_parts``: every part split.json lists, under its own name; split.json is copied as it is.

What the compiled models do not replace (genai_config.json, split.json, the tokenizer's files) is
copied beside them; the input's external-data files are not: a compiled model holds the weights
of the nodes the provider did not take itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.core import KilnError, ModelArtifact
from passes.common.pass_io import copy_folder_rest

GENAI_CONFIG = "genai_config.json"
SPLIT_MANIFEST = "split.json"


def files_to_compile(model: ModelArtifact) -> list[str]:
    """The names, in the artifact's folder, of the ONNX models to compile, in order."""
    folder = Path(model.path)
    if model.format == "onnx":
        return [model.model_file.name]
    if model.format == "onnx_parts":
        manifest = json.loads((folder / SPLIT_MANIFEST).read_text())
        names = [str(entry["file"]) for entry in manifest.get("parts", [])]
    else:
        names = _genai_models(folder)
    missing = [name for name in names if not (folder / name).is_file()]
    if not names or missing:
        where = SPLIT_MANIFEST if model.format == "onnx_parts" else GENAI_CONFIG
        raise KilnError(
            f"{folder}: {where} names no ONNX model to compile"
            if not names
            else f"{folder / where} names {missing}, which are not in the folder"
        )
    return names


def _genai_models(folder: Path) -> list[str]:
    config_file = folder / GENAI_CONFIG
    names: list[str] = []
    if config_file.is_file():
        decoder = json.loads(config_file.read_text()).get("model", {}).get("decoder", {})
        if isinstance(decoder.get("filename"), str):
            names.append(decoder["filename"])
        for group in decoder.get("pipeline") or []:
            names.extend(
                stage["filename"] for stage in group.values() if isinstance(stage, dict) and isinstance(stage.get("filename"), str)
            )
    if not names:
        names = sorted(path.name for path in folder.glob("*.onnx"))
    return list(dict.fromkeys(names))


def external_files(model_file: Path) -> set[str]:
    """The external-data files a model's initializers are stored in."""
    import onnx

    proto = onnx.load(str(model_file), load_external_data=False)
    found: set[str] = set()
    for tensor in proto.graph.initializer:
        found.update(Path(entry.value).name for entry in tensor.external_data if entry.key == "location")
    return found


def copy_the_rest(model: ModelArtifact, compiled: list[str], out: Path) -> list[str]:
    """Copy every file of the input folder that is not a compiled model, its external data or a
    file the compilation wrote; returns the names copied."""
    if model.format == "onnx":
        return []
    folder = Path(model.path)
    skip = set(compiled)
    for name in compiled:
        skip |= external_files(folder / name)
    return copy_folder_rest(folder, out, skip)


def summary(names: list[str], answers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The library warnings of every compilation, by model file."""
    return {name: answers[name]["warnings"] for name in names if answers[name]["warnings"]}
