"""One builder per job key across the runs sharing a store.

``locks/<key>.lock`` is held by the process building the key with ``flock`` (an exclusive lock
on the open file). The kernel releases it when the holder dies, however it dies, SIGKILL
included, so a lock can never outlive its owner: no guess from a pid (which can be reused, and
means nothing on another host), and no window in which two waiters both find an owner dead and
each break the lock the other one just took. The file also records its owner (host, pid, start
time) and the time after which the job cannot still be running (its timeout), for people and
for that one case: a holder past its time (a hung builder that still lives) is not waited for.

Another run that needs the same key waits for the lock, then reads the record the builder left.
The holder removes the file before it unlocks it; a file left by a process that died holding it
is taken over by the next run that needs the key (its flock is free) and removed when released.
A waiter that gets the lock of a file that was removed meanwhile opens the new one again.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from engine.store.store import file_mode

log = logging.getLogger(__name__)

POLL_S = 0.2


def owner() -> dict[str, Any]:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "started": psutil.Process(pid).create_time()}


def owner_alive(who: dict[str, Any]) -> bool | None:
    """True / False for an owner on this host; None when only its host could tell."""
    if who.get("host") != socket.gethostname():
        return None
    try:
        return abs(psutil.Process(int(who["pid"])).create_time() - float(who["started"])) <= 1.0
    except (psutil.NoSuchProcess, KeyError, TypeError, ValueError):
        return False


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock between the processes of this host (study creation, baseline trials)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read(fd: int) -> dict[str, Any] | None:
    """The owner document in the lock file, None when it is empty or unreadable."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        value = json.loads(os.read(fd, 65536).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _take(path: Path) -> int | None:
    """The descriptor of ``path``, locked, or None while another living process holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, file_mode())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            opened, current = os.fstat(fd), os.stat(path)
            if (opened.st_dev, opened.st_ino) == (current.st_dev, current.st_ino):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # released and removed between our open and lock: open the current file


def _past_time(path: Path) -> bool:
    """Whether the holder of ``path`` said it would be done by now (a hung builder)."""
    try:
        held = json.loads(path.read_text(encoding="utf-8"))
        return held.get("until") is not None and time.time() > float(held["until"])
    except (OSError, ValueError, TypeError, AttributeError):
        return False


@contextmanager
def job_lock(folder: Path, key: str, timeout_s: float | None) -> Iterator[bool]:
    """Hold the lock of ``key``; yields True when this process waited for another builder (the
    caller then looks the key up again before building it)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.lock"
    until = time.time() + timeout_s + 60 if timeout_s is not None else None
    waited = False
    while (fd := _take(path)) is None:
        if _past_time(path):
            log.warning("job %s is still locked past its time; building it beside its holder", key)
            yield True
            return
        if not waited:
            log.info("job %s is being built by another run; waiting for it", key)
        waited = True
        time.sleep(POLL_S)
    try:
        left = _read(fd)
        if left is not None:  # its holder died holding it (the kernel released the flock)
            log.warning("taking over the lock of %s left by %s", key, left.get("owner"))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"owner": owner(), "until": until}).encode("utf-8"), 0)
        yield waited
    finally:
        try:
            os.unlink(path)  # before unlocking: a waiter that opened this file opens the next one
        except FileNotFoundError:
            pass
        os.close(fd)
