"""Timing alone across processes: ``KILN_HOST_LOCK``.

A run's gate (engine.execute.gate) keeps its timing jobs apart from its own passes, but two runs
on one machine do not see each other: one run's latency would be measured next to the other's
quantization. Where runs share a machine (a CI runner's parallel jobs, a team's scripts,
``pytest -n``), set ``KILN_HOST_LOCK`` to one file path for all of them: every job then holds that
file shared, and a timing job holds it exclusively, so no job of any of those runs executes while
one of them times a model.

It is a readers-writer ``flock`` plus a turnstile (the same path with the suffix ``.turnstile``)
that a waiting timing job holds, so that a stream of other jobs cannot starve it. Any process may
take part by following the same protocol: the test suite's processes do (tests/alone.py).
``flock`` is used directly: no locking library in the environment offers a readers-writer lock
across processes. Locks are polled (every 50 ms), not waited on in the kernel, so a job thread
waiting for the machine never outlives the engine. A process that dies releases what it held.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from engine.core import InputError, Problem

#: the environment variable naming the lock file that runs sharing a machine share
HOST_LOCK_ENV = "KILN_HOST_LOCK"

_POLL_S = 0.05


class HostLock:
    """The machine-wide readers-writer lock at ``path`` (``shared`` for a job, ``exclusive`` for a timing job)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.turnstile = path.with_suffix(".turnstile")

    @classmethod
    def from_env(cls) -> HostLock | None:
        """The lock ``$KILN_HOST_LOCK`` names, checked now (a bad path is the user's input, exit 2); None where unset."""
        raw = os.environ.get(HOST_LOCK_ENV, "").strip()
        if not raw:
            return None
        lock = cls(Path(raw).expanduser())
        for path in (lock.path, lock.turnstile):
            try:
                with path.open("a"):
                    pass
            except OSError as error:
                problem = Problem(
                    where=HOST_LOCK_ENV,
                    message=f"the lock file cannot be opened: {error.strerror or error}",
                    expected="a path to a file that every run on this machine can create and open (its folder must exist)",
                    given=repr(raw),
                    hint=f"point {HOST_LOCK_ENV} at a file in a writable folder, such as /tmp/kiln-host.lock, or unset it",
                    file="<environment>",
                )
                raise InputError(problems=[problem]) from None
        return lock

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._hold(fcntl.LOCK_SH):
            yield

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._hold(fcntl.LOCK_EX):
            yield

    @contextlib.contextmanager
    def _hold(self, mode: int) -> Iterator[None]:
        with contextlib.ExitStack() as held:
            with _locked(self.turnstile, fcntl.LOCK_EX):  # a waiting exclusive holder keeps it: no one else gets in
                held.enter_context(_locked(self.path, mode))
            yield


@contextlib.contextmanager
def _locked(path: Path, mode: int) -> Iterator[IO[str]]:
    """``path`` locked in ``mode`` on a descriptor of its own (each holder's lock is separate,
    also between threads of one process), polled until granted."""
    with path.open("a") as handle:
        while True:
            try:
                fcntl.flock(handle, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(_POLL_S)
        try:
            yield handle
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
