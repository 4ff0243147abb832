"""Canonical JSON and content digests: the hashing scheme every cache key stands on.

The scheme is pinned by golden tests (tests/engine/core/test_hashing.py); changing it must bump
``SCHEME``, which invalidates every key at once instead of silently mixing two schemes.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from engine.core.errors import InputError, Problem

SCHEME = "kiln-1"
_CHUNK = 1 << 20


def canonical_json(value: Any) -> str:
    """JSON with sorted keys, no whitespace and no NaN: the same value always gives the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_default)


def _default(value: Any) -> Any:
    if isinstance(value, Path):
        return value.as_posix()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot hash a value of type {type(value).__name__}: {value!r}")


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_json(value: Any) -> str:
    return sha256_text(canonical_json(value))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _refuse(path: Path, message: str, given: str) -> InputError:
    return InputError(
        [
            Problem(
                where=str(path),
                message=message,
                expected="regular files and folders (symlinks to them are followed)",
                given=given,
                hint="remove it, or point the workflow at a folder holding only the model's files",
            )
        ]
    )


def special_file_kind(mode: int) -> str:
    """'a FIFO', 'a character device', ... for a mode that is not a regular file or a folder."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "a socket" if stat.S_ISSOCK(mode) else "a special file"


def _stat(path: Path) -> os.stat_result:
    """``stat`` following symlinks; a dangling symlink or a symlink loop is refused, located."""
    try:
        return path.stat()
    except FileNotFoundError as error:
        if path.is_symlink():
            raise _refuse(path, "is a symlink to nothing", f"a link to {os.readlink(path)}") from error
        raise _refuse(path, "does not exist", "a missing path") from error
    except OSError as error:  # ELOOP: a symlink that points back at itself
        raise _refuse(path, f"cannot be read: {error.strerror or error}", "a symlink loop or an unreadable path") from error


def iter_files(root: Path) -> Iterable[Path]:
    """Every regular file below ``root`` in a stable order (symlinks followed, hidden files kept).

    Special files (FIFOs, devices, sockets: reading one can hang forever), dangling symlinks and
    symlinks that lead back to a folder being walked are refused with an ``InputError`` naming
    the path, before any byte is read."""
    root = Path(root)
    top = _stat(root)
    if stat.S_ISREG(top.st_mode):
        yield root
        return
    if not stat.S_ISDIR(top.st_mode):
        raise _refuse(root, f"is {special_file_kind(top.st_mode)}, not a file or folder", special_file_kind(top.st_mode))
    # depth first, files of a folder before its subfolders, names sorted (as os.walk gave them)
    stack: list[tuple[Path, tuple[tuple[int, int], ...]]] = [(root, ((top.st_dev, top.st_ino),))]
    while stack:
        folder, ancestors = stack.pop()
        files, folders = [], []
        for name in sorted(os.listdir(folder)):
            path = folder / name
            info = _stat(path)
            if stat.S_ISREG(info.st_mode):
                files.append(path)
            elif stat.S_ISDIR(info.st_mode):
                if (info.st_dev, info.st_ino) in ancestors:
                    raise _refuse(path, "leads back to a folder that contains it (a symlink loop)", f"a link to {os.path.realpath(path)}")
                folders.append((path, (*ancestors, (info.st_dev, info.st_ino))))
            else:
                raise _refuse(
                    path, f"is {special_file_kind(info.st_mode)}; Kiln hashes only regular files", special_file_kind(info.st_mode)
                )
        yield from files
        stack.extend(reversed(folders))


def manifest(root: Path, only: Collection[str] | None = None) -> list[dict[str, Any]]:
    """Sorted (relative path, size, sha256) of every file: no timestamps, no absolute paths.
    ``only``: the relative paths to list (the files of a folder that make the artifact); None: all."""
    root = Path(root)
    entries: list[tuple[str, int, str]] = []
    for file in iter_files(root):
        rel = file.name if root.is_file() else file.relative_to(root).as_posix()
        if only is not None and rel not in only:
            continue
        entries.append((rel, file.stat().st_size, sha256_file(file)))
    entries.sort()
    return [{"path": rel, "size": size, "sha256": digest} for rel, size, digest in entries]


def digest_tree(root: Path, kind: str) -> str:
    """The content digest of an artifact: its kind plus the manifest of its files."""
    return sha256_json({"scheme": SCHEME, "kind": kind, "files": manifest(Path(root))})
