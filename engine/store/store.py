"""The artifact store: immutable content under ``objects/``, a key index under ``keys/``.

- ``objects/<digest>/``: one artifact's files, written once, never changed.
- ``keys/<key>.json``: what a job key resolved to (an artifact digest or an evaluation's figures)
  plus the key document itself, so ``engine plan --explain`` can tell which field changed.
- ``manifests/<digest>.json``: each object's files (path, size, sha256) and their inode and
  times when published, so an object is checked cheaply on every use and fully on delivery.
- ``tmp/``: staging folders, each with an ``owner.json`` (host, pid); everything reaches its final
  name by an atomic rename. Folders whose owner is gone are removed when a run starts.
- ``digests/``: a memo of the digests of users' files (see ``cached_digest``).

A corrupt or dangling key entry, a record of the wrong shape, or an object whose files no longer
match its digest is a miss plus a warning, never a crash: the job runs again. Many runs may share
one store: two writers of the same key write the same content, and the rename makes one of them win.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Collection
from pathlib import Path
from typing import Any

import psutil

from engine.core.errors import InputError, KilnError
from engine.core.hashing import SCHEME, iter_files, manifest, sha256_file, sha256_json
from engine.store import records

log = logging.getLogger(__name__)


class StoreDamaged(KilnError):
    """The store holds something damaged that a run cannot do without (a chosen model whose files
    no longer match their digest): not the user's input, so the CLI gives it its own exit code (4)
    and points at `engine verify --repair`."""


_umask: int | None = None


def file_mode() -> int:
    """The mode ``open()`` gives a new file here: 0o666 less the process umask (0o644 under the
    usual 022). ``tempfile.mkstemp`` creates its files 0o600 whatever the umask, so a file it
    made and renamed into place would be the only private file among a run's outputs. The umask
    is read from /proc (reading it with ``os.umask`` means setting it, which races with threads
    creating files), else set back at once, and kept: a process does not change it."""
    global _umask
    if _umask is None:
        try:
            with open("/proc/self/status", encoding="ascii") as status:
                _umask = next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
        except (OSError, StopIteration, ValueError, IndexError):
            _umask = os.umask(0o022)
            os.umask(_umask)
    return 0o666 & ~_umask


def write_json_atomic(path: Path, value: Any) -> None:
    """Write ``value`` as JSON to ``path`` atomically (``write_text_atomic``)."""
    write_text_atomic(path, json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder + rename; the file gets
    the mode any other new file gets (``file_mode``), not mkstemp's 0o600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


#: a staging folder without an owner.json (an older engine's, or one caught between mkdir and
#: write) is stale once it is this old
UNOWNED_STALE_S = 3600.0


def _stamp(path: Path) -> list[int]:
    """What changes when a file is written in place: inode, size, mtime and ctime (ctime cannot be
    set back by a user, unlike mtime)."""
    st = path.stat()
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _tree_digest(kind: str, files: list[dict[str, Any]]) -> str:
    """``hashing.digest_tree`` from an already computed manifest."""
    return sha256_json({"scheme": SCHEME, "kind": kind, "files": files})


def _relative(root: Path, file: Path) -> str:
    return file.name if root.is_file() else file.relative_to(root).as_posix()


class Store:
    def __init__(self, root: Path, read_only: bool = False) -> None:
        self.root = Path(root)
        #: a view that writes nothing (`engine plan`): no folder is created, no memo filed
        self.read_only = read_only
        self.objects = self.root / "objects"
        self.keys = self.root / "keys"
        self.tmp = self.root / "tmp"
        self.manifests = self.root / "manifests"

    def ensure(self) -> Store:
        if self.read_only:
            return self
        for folder in (self.objects, self.keys, self.tmp, self.manifests):
            folder.mkdir(parents=True, exist_ok=True)
        return self

    def has_records(self) -> bool:
        """Whether any record is filed (False: a new or emptied store)."""
        try:
            with os.scandir(self.keys) as entries:
                return any(entry.name.endswith(".json") for entry in entries)
        except FileNotFoundError:
            return False

    # -- keys ---------------------------------------------------------------------------------
    def key_path(self, key: str) -> Path:
        return self.keys / f"{key}.json"

    def read_record(self, key: str) -> tuple[dict[str, Any] | None, str | None]:
        """The record filed under ``key`` and, when it cannot be served, why (None, None: absent)."""
        path = self.key_path(key)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None, None
        except (OSError, ValueError) as error:
            return None, f"is corrupt ({error})"
        why = records.problem(key, record)
        return (None, why) if why else (record, None)

    def lookup(self, key: str, full: bool = False) -> dict[str, Any] | None:
        """The record of ``key``, or None when absent, unreadable, of the wrong shape, or pointing
        at an object that is missing or no longer matches its digest (checked cheaply, or fully
        when ``full``)."""
        path = self.key_path(key)
        record, why = self.read_record(key)
        if why:
            log.warning("cache entry %s %s; treating it as a miss", path, why)
            return None
        if record is None:
            return None
        digest = record.get("digest")
        if digest:
            kind = record["format"] if record["kind"] == "pass" else record["kind"]
            bad = self.check_object(digest, kind, full=full)
            if bad:
                log.warning("cache entry %s points at object %s, which %s; treating it as a miss", path, digest, bad)
                self.discard_object(digest)
                return None
        return record

    def record(self, key: str, record: dict[str, Any]) -> None:
        write_json_atomic(self.key_path(key), {**record, "key": key})

    # -- objects ------------------------------------------------------------------------------
    def object_path(self, digest: str) -> Path:
        return self.objects / digest

    def manifest_path(self, digest: str) -> Path:
        return self.manifests / f"{digest}.json"

    def staging(self, prefix: str) -> Path:
        path = self.tmp / f"{prefix}-{uuid.uuid4().hex[:12]}"
        path.mkdir(parents=True)
        write_json_atomic(path / "owner.json", _owner())
        return path

    def publish(self, folder: Path, kind: str) -> str:
        """Move a finished staging ``folder`` into ``objects/<digest>``; returns the digest."""
        files = manifest(folder)
        digest = _tree_digest(kind, files)
        final = self.object_path(digest)
        if final.is_dir() and not self.check_object(digest, kind):
            shutil.rmtree(folder, ignore_errors=True)
            return digest
        if final.exists():
            self.discard_object(digest)  # a damaged copy: replaced by this good one
        stamps = {entry["path"]: _stamp(folder / entry["path"]) for entry in files}
        try:
            os.replace(folder, final)
        except OSError:
            if not final.is_dir():
                raise
            shutil.rmtree(folder, ignore_errors=True)  # another writer published the same content first
            return digest
        write_json_atomic(self.manifest_path(digest), {"digest": digest, "kind": kind, "files": files, "stamps": stamps})
        return digest

    def check_object(self, digest: str, kind: str | None = None, full: bool = False) -> str | None:
        """Why the object ``digest`` cannot be served, or None when it can.

        Cheap (every use): the files present, their sizes, and their inode / mtime / ctime as
        published; a file whose stamp moved is hashed again. Full (delivery, ``engine verify``):
        every file hashed, the digest recomputed."""
        try:
            return self._check_object(digest, kind, full)
        except InputError as error:  # a FIFO, a device or a symlink loop planted in an object
            return f"holds something that is not a regular file ({error.problems[0].where})"

    def _check_object(self, digest: str, kind: str | None, full: bool) -> str | None:
        folder = self.object_path(digest)
        if not folder.is_dir():
            return "is missing"
        try:
            meta = json.loads(self.manifest_path(digest).read_text(encoding="utf-8"))
            files: list[dict[str, Any]] = meta["files"]
            kind = kind or meta["kind"]
            stamps: dict[str, list[int]] = meta.get("stamps") or {}
            if meta["kind"] != kind or _tree_digest(kind, files) != digest:
                raise ValueError("manifest does not describe this digest")
        except (OSError, ValueError, KeyError, TypeError):
            if kind is None:
                return "has no readable manifest and no known kind"
            return self._rebuild_manifest(digest, kind)
        if full:
            actual = _tree_digest(kind, manifest(folder))
            return None if actual == digest else f"no longer matches its digest (its files hash to {actual})"
        present = {_relative(folder, f): f for f in iter_files(folder)}
        expected = {entry["path"]: entry for entry in files}
        if set(present) != set(expected):
            extra, gone = sorted(set(present) - set(expected)), sorted(set(expected) - set(present))
            return f"has files added {extra} or removed {gone} since it was published"
        moved = False
        for rel, file in present.items():
            stamp = _stamp(file)
            if stamp[1] != expected[rel]["size"]:
                return f"has {rel} of {stamp[1]} bytes, published with {expected[rel]['size']}"
            if stamp != stamps.get(rel):
                if sha256_file(file) != expected[rel]["sha256"]:
                    return f"has {rel} changed since it was published"
                stamps[rel], moved = stamp, True
        if moved:
            write_json_atomic(self.manifest_path(digest), {**meta, "stamps": stamps})
        return None

    def _rebuild_manifest(self, digest: str, kind: str) -> str | None:
        """An object without a manifest (published by an older engine): hash it fully once."""
        folder = self.object_path(digest)
        files = manifest(folder)
        if _tree_digest(kind, files) != digest:
            return "no longer matches its digest"
        stamps = {entry["path"]: _stamp(folder / entry["path"]) for entry in files}
        write_json_atomic(self.manifest_path(digest), {"digest": digest, "kind": kind, "files": files, "stamps": stamps})
        return None

    def discard_object(self, digest: str) -> None:
        """Take a damaged object out of the store (renamed away first, so no reader sees half)."""
        folder = self.object_path(digest)
        self.tmp.mkdir(parents=True, exist_ok=True)
        doomed = self.tmp / f"discarded-{digest[:16]}-{uuid.uuid4().hex[:8]}"
        try:
            os.replace(folder, doomed)
        except OSError:
            return
        shutil.rmtree(doomed, ignore_errors=True)
        self.manifest_path(digest).unlink(missing_ok=True)

    # -- staging folders left by killed runs -----------------------------------------------------
    def clean_stale_staging(self) -> list[Path]:
        """Remove staging folders whose owner process is gone (on this host); returns them."""
        removed = []
        if not self.tmp.is_dir():
            return removed
        for folder in self.tmp.iterdir():
            if folder.is_dir() and _stale(folder):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
        if removed:
            log.info("removed %d staging folder(s) left by runs that are gone", len(removed))
        return removed

    # -- digests of user files ----------------------------------------------------------------
    def cached_digest(self, path: Path, kind: str, extra: dict[str, Any] | None = None, only: Collection[str] | None = None) -> str:
        """``digest_tree(path, kind)`` remembered by the files' names, inodes, sizes, mtimes and
        ctimes, so a large input model is hashed once, not on every run. ``only``: the relative
        paths of the folder's files that make the artifact (a Hugging Face cache snapshot may hold
        files Kiln does not use); None: every file.

        A memo entry holds the manifest it was computed from, and the digest is recomputed from
        that manifest on every read: an entry can never name a digest its files did not give."""
        root = Path(path)
        stats = {_relative(root, f): _stamp(f) for f in iter_files(root) if only is None or _relative(root, f) in only}
        stamp = sha256_json({"kind": kind, "root": str(root.resolve()), "stats": stats, "extra": extra or {}})
        entry = self.root / "digests" / f"{stamp}.json"
        try:
            memo = json.loads(entry.read_text(encoding="utf-8"))
            digest = _memo_digest(memo, kind, stats, extra)
        except FileNotFoundError:
            digest = None
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning("digest memo %s is corrupt (%s); hashing %s again", entry, error, root)
            digest = None
        if digest is not None:
            return digest
        entries = manifest(root, only)
        digest = _memo_digest({"files": entries}, kind, stats, extra)
        assert digest is not None
        if self.read_only:
            return digest
        write_json_atomic(entry, {"digest": digest, "path": str(root), "files": entries, "stats": stats})
        return digest

    # -- slots: the last key each job of a workflow had, for `engine plan --explain` -------------
    def remember(self, slot: str, key: str, key_doc: dict[str, Any]) -> None:
        if self.read_only:
            return
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


def _memo_digest(memo: dict[str, Any], kind: str, stats: dict[str, list[int]], extra: dict[str, Any] | None) -> str | None:
    """The digest a memo's manifest gives, when that manifest names exactly the files in ``stats``
    with their sizes; None otherwise."""
    files = memo["files"]
    if {e["path"]: e["size"] for e in files} != {rel: stamp[1] for rel, stamp in stats.items()}:
        raise ValueError("its manifest does not list the files there now")
    digest = _tree_digest(kind, files)
    if extra:
        digest = sha256_json({"tree": digest, "extra": extra})
    if "digest" in memo and memo["digest"] != digest:
        raise ValueError(f"it names digest {memo['digest']}, but its manifest gives {digest}")
    return digest


def _owner() -> dict[str, Any]:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "started": psutil.Process(pid).create_time()}


def _stale(folder: Path) -> bool:
    """A staging folder is stale when its owner (host, pid, start time) is not running here."""
    try:
        owner = json.loads((folder / "owner.json").read_text(encoding="utf-8"))
        host, pid, started = owner["host"], int(owner["pid"]), float(owner["started"])
    except (OSError, ValueError, KeyError, TypeError):
        try:
            return time.time() - folder.stat().st_mtime > UNOWNED_STALE_S
        except OSError:
            return False
    if host != socket.gethostname():
        return False  # another host's (a shared store): only that host can tell
    try:
        return abs(psutil.Process(pid).create_time() - started) > 1.0  # the pid was reused
    except psutil.NoSuchProcess:
        return True
