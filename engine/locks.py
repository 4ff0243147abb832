"""One builder per job key across the runs sharing a store.

``locks/<key>.lock`` is created exclusively by the process about to build the key, holding its
owner (host, pid, start time) and the time after which the job cannot still be running (its
timeout). Another run that needs the same key waits for the lock to go, then reads the record the
builder left. A lock whose owner is dead on this host, or that is past its time, is broken.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.trials import owner, owner_alive

log = logging.getLogger(__name__)

POLL_S = 0.2
#: a lock without a readable owner (caught between create and write) is broken once this old
UNREADABLE_STALE_S = 30.0


def _stale(path: Path) -> bool:
    try:
        held = json.loads(path.read_text(encoding="utf-8"))
        alive = owner_alive(held["owner"])
        until = float(held["until"]) if held.get("until") is not None else None
    except FileNotFoundError:
        return False
    except (OSError, ValueError, KeyError, TypeError):
        try:
            return time.time() - path.stat().st_mtime > UNREADABLE_STALE_S
        except OSError:
            return False
    if alive is False:
        return True
    return until is not None and time.time() > until


def _try_create(path: Path, until: float | None) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump({"owner": owner(), "until": until}, handle)
    return True


@contextmanager
def job_lock(folder: Path, key: str, timeout_s: float | None) -> Iterator[bool]:
    """Hold the lock of ``key``; yields True when this process waited for another builder (the
    caller then looks the key up again before building it)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.lock"
    until = time.time() + timeout_s + 60 if timeout_s is not None else None
    waited = False
    while not _try_create(path, until):
        if _stale(path):
            log.warning("breaking the lock of %s: its owner is gone", key)
            path.unlink(missing_ok=True)
            continue
        if not waited:
            log.info("job %s is being built by another run; waiting for it", key)
        waited = True
        time.sleep(POLL_S)
    try:
        yield waited
    finally:
        path.unlink(missing_ok=True)
