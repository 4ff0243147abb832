"""The artifact store: immutable content under ``objects/``, a key index under ``keys/``.

- ``objects/<digest>/``: one artifact's files, written once, never changed.
- ``keys/<key>.json``: what a job key resolved to (an artifact digest or an evaluation's figures)
  plus the key document itself, so ``engine plan --explain`` can tell which field changed.
- ``tmp/``: staging folders; everything reaches its final name by an atomic rename.

A corrupt or dangling key entry is a miss plus a warning, never a crash. Many runs may share one
store: two writers of the same key write the same content, and the rename makes one of them win.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from engine.core.hashing import digest_tree, sha256_json

log = logging.getLogger(__name__)


def write_json_atomic(path: Path, value: Any) -> None:
    """Write ``value`` as JSON to ``path`` via a temporary file in the same folder + rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(value, handle, indent=2, sort_keys=True, default=str)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Store:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.objects = self.root / "objects"
        self.keys = self.root / "keys"
        self.tmp = self.root / "tmp"

    def ensure(self) -> Store:
        for folder in (self.objects, self.keys, self.tmp):
            folder.mkdir(parents=True, exist_ok=True)
        return self

    # -- keys ---------------------------------------------------------------------------------
    def key_path(self, key: str) -> Path:
        return self.keys / f"{key}.json"

    def lookup(self, key: str) -> dict[str, Any] | None:
        """The record of ``key``, or None when absent, unreadable or pointing at a missing object."""
        path = self.key_path(key)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            log.warning("cache entry %s is corrupt (%s); treating it as a miss", path, error)
            return None
        if not isinstance(record, dict) or record.get("key") != key:
            log.warning("cache entry %s does not hold key %s; treating it as a miss", path, key)
            return None
        digest = record.get("digest")
        if digest and not (self.objects / digest).is_dir():
            log.warning("cache entry %s points at missing object %s; treating it as a miss", path, digest)
            return None
        return record

    def record(self, key: str, record: dict[str, Any]) -> None:
        write_json_atomic(self.key_path(key), {**record, "key": key})

    # -- objects ------------------------------------------------------------------------------
    def object_path(self, digest: str) -> Path:
        return self.objects / digest

    def staging(self, prefix: str) -> Path:
        path = self.tmp / f"{prefix}-{uuid.uuid4().hex[:12]}"
        path.mkdir(parents=True)
        return path

    def publish(self, folder: Path, kind: str) -> str:
        """Move a finished staging ``folder`` into ``objects/<digest>``; returns the digest."""
        digest = digest_tree(folder, kind)
        final = self.object_path(digest)
        if final.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
            return digest
        try:
            os.replace(folder, final)
        except OSError:
            if not final.is_dir():
                raise
            shutil.rmtree(folder, ignore_errors=True)  # another writer published the same content first
        return digest

    # -- digests of user files ----------------------------------------------------------------
    def cached_digest(self, path: Path, kind: str, extra: dict[str, Any] | None = None) -> str:
        """``digest_tree(path, kind)`` remembered by the files' paths, sizes and mtimes, so a
        large input model is hashed once, not on every run."""
        from engine.core.hashing import iter_files

        stats = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in iter_files(path)]
        stamp = sha256_json({"kind": kind, "stats": stats, "extra": extra or {}})
        entry = self.root / "digests" / f"{stamp}.json"
        try:
            return str(json.loads(entry.read_text())["digest"])
        except (OSError, ValueError, KeyError):
            pass
        digest = digest_tree(path, kind)
        if extra:
            digest = sha256_json({"tree": digest, "extra": extra})
        write_json_atomic(entry, {"digest": digest, "path": str(path)})
        return digest

    # -- slots: the last key each job of a workflow had, for `engine plan --explain` -------------
    def remember(self, slot: str, key: str, key_doc: dict[str, Any]) -> None:
        path = self.root / "slots" / f"{slot}.json"
        try:
            if json.loads(path.read_text(encoding="utf-8")).get("key") == key:
                return
        except (OSError, ValueError):
            pass
        write_json_atomic(path, {"key": key, "key_doc": key_doc})

    def recall(self, slot: str) -> dict[str, Any] | None:
        try:
            value = json.loads((self.root / "slots" / f"{slot}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None
