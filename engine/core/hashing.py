"""Canonical JSON and content digests: the hashing scheme every cache key stands on.

The scheme is pinned by golden tests (tests/engine/core/test_hashing.py); changing it must bump
``SCHEME``, which invalidates every key at once instead of silently mixing two schemes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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


def iter_files(root: Path) -> Iterable[Path]:
    """Every regular file below ``root`` in a stable order (symlinks followed, hidden files kept)."""
    if root.is_file():
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        for name in sorted(filenames):
            yield Path(dirpath) / name


def manifest(root: Path) -> list[dict[str, Any]]:
    """Sorted (relative path, size, sha256) of every file: no timestamps, no absolute paths."""
    root = Path(root)
    entries: list[tuple[str, int, str]] = []
    for file in iter_files(root):
        rel = file.name if root.is_file() else file.relative_to(root).as_posix()
        entries.append((rel, file.stat().st_size, sha256_file(file)))
    entries.sort()
    return [{"path": rel, "size": size, "sha256": digest} for rel, size, digest in entries]


def digest_tree(root: Path, kind: str) -> str:
    """The content digest of an artifact: its kind plus the manifest of its files."""
    return sha256_json({"scheme": SCHEME, "kind": kind, "files": manifest(Path(root))})
