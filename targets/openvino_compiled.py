"""OpenVINO's compiled models kept in the store, checked before they are served.

Compiling all-MiniLM-L6-v2 for the CPU takes 0.5-0.9 s on a 2-core host; importing the compiled
blob OpenVINO keeps under ``CACHE_DIR`` takes 0.1 s. A paired timing opens a fresh pair of
sessions per block (five blocks: ten compilations of two models it already compiled), and each
fidelity evaluation and accuracy-driven pass opens its own, so on bert-openvino.json
compilation was a fifth of the timings' time, spent while the machine is held for timing alone.

A fresh session from a blob is still a fresh session: its memory and threads are laid out anew
(what the timing's blocks are for), and OpenVINO's cache key covers the model, the device and
every compile option, so an entry never answers another compilation. The blob comes from this
host: OpenVINO writes it here and nothing else does.

Each model (by artifact digest) has a folder, ``<target cache>/compiled/<digest>/``; a flock on
``<digest>.lock`` makes the check, the compilation and the stamp one step between processes. The
stamp (``stamp.json``) records each blob's size, sha256 and the inode and mtime it had when
hashed; before a compilation every file is checked against it: one whose inode, mtime or size
moved is hashed again, one that does not match its sha256 or was never stamped (a crash between
OpenVINO's write and the stamp) is removed, so OpenVINO compiles it again. Models whose files
pass ``MAX_BYTES`` (a decoder's GBs: the blob would double them on disk, and their compilation is
small beside their measurement) are compiled every time.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.core import ModelArtifact
from engine.core.hashing import sha256_file

#: models larger than this (all their files) are not kept compiled
MAX_BYTES = 1 << 30
STAMP = "stamp.json"


@contextmanager
def compiled_cache(root: Path | None, model: ModelArtifact) -> Iterator[str | None]:
    """The ``CACHE_DIR`` to compile ``model`` with, checked and held for the block (None: compile
    without one); the blobs OpenVINO wrote in the block are stamped when it ends."""
    if root is None or not model.digest or _size(Path(model.path)) > MAX_BYTES:
        yield None
        return
    base = Path(root) / "compiled"
    folder = base / model.digest
    folder.mkdir(parents=True, exist_ok=True)
    with open(base / f"{model.digest}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        stamp = _checked(folder)
        yield str(folder)
        _stamp(folder, stamp)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _checked(folder: Path) -> dict[str, dict[str, Any]]:
    """The stamp's entries whose files still hold what was stamped; every other file is removed."""
    stamp = _read(folder / STAMP)
    kept: dict[str, dict[str, Any]] = {}
    for path in folder.iterdir():
        if path.name == STAMP:
            continue
        entry = stamp.get(path.name)
        if entry is not None and path.is_file():
            entry = _matching(path, entry)
        if entry is not None:
            kept[path.name] = entry
        elif path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    if kept != stamp:
        _write(folder / STAMP, kept)
    return kept


def _matching(path: Path, entry: dict[str, Any]) -> dict[str, Any] | None:
    """``entry`` if ``path`` still holds what it stamped (with the inode and mtime it has now,
    where it was hashed again), else None."""
    info = path.stat()
    if info.st_size != entry.get("size"):
        return None
    if (info.st_ino, info.st_mtime_ns) == (entry.get("inode"), entry.get("mtime_ns")):
        return entry
    if sha256_file(path) != entry.get("sha256"):
        return None
    return {**entry, "inode": info.st_ino, "mtime_ns": info.st_mtime_ns}  # the same bytes, moved


def _stamp(folder: Path, stamp: dict[str, dict[str, Any]]) -> None:
    """Add the files OpenVINO wrote since the check (its new blobs) to the stamp."""
    new = {path.name: _entry(path) for path in folder.iterdir() if path.is_file() and path.name != STAMP and not path.name.startswith(".")}
    new = {name: entry for name, entry in new.items() if name not in stamp}
    if new:
        _write(folder / STAMP, {**stamp, **new})


def _entry(path: Path) -> dict[str, Any]:
    info = path.stat()
    return {"size": info.st_size, "sha256": sha256_file(path), "inode": info.st_ino, "mtime_ns": info.st_mtime_ns}


def _read(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def _write(path: Path, stamp: dict[str, dict[str, Any]]) -> None:
    part = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    part.write_text(json.dumps(stamp, sort_keys=True))
    os.replace(part, path)
