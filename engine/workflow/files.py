"""Files a workflow names: checked the way the run will read them, without running anything.

A path must be one a file system can hold; a model file must be a regular file holding what
its format says (an ONNX file is walked as protobuf, field by field, reading only the tags); a
model shipped in an installed package is found through the import system's metadata, never by
importing the package.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import stat
from pathlib import Path

from engine.core.hashing import special_file_kind
from engine.workflow.schema import check_path_text

ONNX_FIELDS = {  # ModelProto (onnx.proto): field number -> wire type (0 varint, 2 length-delimited)
    1: 0,  # ir_version
    2: 2,  # producer_name
    3: 2,  # producer_version
    4: 2,  # domain
    5: 0,  # model_version
    6: 2,  # doc_string
    7: 2,  # graph
    8: 2,  # opset_import
    14: 2,  # metadata_props
    20: 2,  # training_info
    25: 2,  # functions
    26: 2,  # configuration
}
MAX_TOP_LEVEL_FIELDS = 100_000
MAX_CONFIG_BYTES = 16 * 1024 * 1024  # a Hugging Face config.json is a few kilobytes


def user_path(base: Path, text: str) -> Path:
    """``text`` relative to ``base``, made absolute; ValueError saying why when it cannot be a
    path or names what the engine never reads (see ``readable_kind_problem``). Every file and
    folder a workflow names passes here: the input, data files, factories and code files."""
    check_path_text(text)
    return resolved_path(base, text)


def resolved_path(base: Path, text: str) -> Path:
    """``user_path`` for a text already known to be a path: resolved, and refused (ValueError)
    when it is a symlink loop or neither a regular file nor a folder."""
    try:
        path = (base / text).resolve()
    except RuntimeError:  # a symlink loop, before Python 3.13
        raise ValueError("it is a symlink loop") from None
    except OSError as error:
        raise ValueError("it is a symlink loop" if error.errno == errno.ELOOP else f"cannot resolve the path: {error}") from None
    problem = readable_kind_problem(path)
    if problem:
        raise ValueError(problem)
    return path


def readable_kind_problem(path: Path) -> str | None:
    """Why ``path`` is not something the engine reads (a regular file or a folder), or None;
    a path that does not exist is not a problem here (``exists`` tells)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        code = getattr(error, "errno", None)
        if code == errno.ELOOP:
            return "it is a symlink loop"
        if code in (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG):  # not there
            return None
        return f"cannot read it: {getattr(error, 'strerror', None) or error}"
    if stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode):
        return None
    return f"it is {special_file_kind(info.st_mode)}, not a regular file or a folder"


def exists(path: Path) -> bool:
    """Whether ``path`` exists; False, not an error, when the system cannot tell (a name too long, no permission)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def regular_file_problem(path: Path) -> str | None:
    """Why ``path`` is not a non-empty regular file that can be read, or None."""
    try:
        info = path.stat()
    except (OSError, ValueError) as error:
        return f"cannot read it: {getattr(error, 'strerror', None) or error}"
    if stat.S_ISDIR(info.st_mode):
        return "it is a folder, not a file"
    if not stat.S_ISREG(info.st_mode):
        return f"it is {special_file_kind(info.st_mode)}, not a regular file"
    if info.st_size == 0:
        return "the file is empty"
    if not os.access(path, os.R_OK):
        return "the file cannot be read (permissions)"
    return None


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def onnx_file_problem(path: Path) -> str | None:
    """Why ``path`` is not an ONNX model file, or None. Reads the top-level protobuf tags only
    (a few bytes each; the graph's bytes are skipped), so a large model is checked at once."""
    problem = regular_file_problem(path)
    if problem:
        return problem
    size = path.stat().st_size
    has_graph = False
    with open(path, "rb") as handle:
        at = 0
        for _ in range(MAX_TOP_LEVEL_FIELDS):
            if at == size:
                break
            handle.seek(at)
            head = handle.read(20)
            try:
                tag, after = _varint(head, 0)
                number, wire = tag >> 3, tag & 7
                if ONNX_FIELDS.get(number) != wire:
                    return f"it is not an ONNX model (byte {at}: no ModelProto field {number} of wire type {wire})"
                if wire == 0:
                    _, after = _varint(head, after)
                    at += after
                else:
                    length, after = _varint(head, after)
                    at += after + length
            except ValueError:
                return f"it is not an ONNX model (byte {at}: a truncated field)"
            if at > size:
                return f"it is not an ONNX model (a field runs past the end of the file at byte {at})"
            has_graph = has_graph or number == 7
    if not has_graph:
        return "it is not an ONNX model (it holds no graph)"
    return None


def hf_folder_problem(path: Path, weight_files: tuple[str, ...]) -> str | None:
    """Why ``path`` is not a Hugging Face model folder (config.json + weights), or None."""
    config = path / "config.json"
    problem = regular_file_problem(config)
    if problem:
        return f"config.json: {problem}"
    try:
        with open(config, "rb") as handle:
            text = handle.read(MAX_CONFIG_BYTES + 1)
        if len(text) > MAX_CONFIG_BYTES:
            return f"config.json is larger than {MAX_CONFIG_BYTES // 1024 // 1024} MiB"
        if not isinstance(json.loads(text), dict):
            return "config.json is not a JSON object"
    except (ValueError, OSError, RecursionError) as error:
        return f"config.json is not JSON ({error})"
    weights = [path / name for name in weight_files if exists(path / name)]
    for weight in weights:
        problem = regular_file_problem(weight)
        if problem:
            return f"{weight.name}: {problem}"
    return None


def package_folder(name: str) -> Path | None:
    """The folder of the installed top-level package ``name``, found without importing it
    (``find_spec`` of a top-level name only asks the finders); None when it is not installed."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def package_model_folder(package: Path, marker: str) -> Path | None:
    """The shallowest folder inside ``package`` (itself, then up to two levels down, in name
    order) that holds ``marker`` (config.json for a Hugging Face model, model.onnx for ONNX)."""
    level = [package]
    for _ in range(3):
        for folder in level:
            if exists(folder / marker):
                return folder
        level = sorted(child for folder in level for child in _subfolders(folder))
    return None


def _subfolders(folder: Path) -> list[Path]:
    try:
        return [entry for entry in folder.iterdir() if entry.is_dir() and not entry.name.startswith((".", "__"))]
    except OSError:
        return []
