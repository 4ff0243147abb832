"""Tests that assert on measured speed keep the machine to themselves, also when the suite runs on
several processes.

pyproject's addopts run the suite with pytest-xdist, one test process per core. A test that times
models and asserts on the comparison (an example's choice, a paired interval, an overlap of two
timings) would then share the cores with another test and measure that test's load. Two marks:

- ``alone``: for its setup, call and teardown the test holds the run's lock exclusively, every
  other test holds it shared, so nothing runs beside it and the rest still run side by side. For
  a test that times in its own process, or through an executor that does not take the lock.
- ``timed``: the test runs beside others, and only its engine runs' timing jobs hold the lock
  exclusively: the test sets ``KILN_HOST_LOCK`` (engine.execute.host_lock) to the run's lock file,
  which the engine's gate holds shared for each job and exclusively for each timing job. For the
  examples, whose exports and quantizations (most of their time) need no quiet machine. Such a
  test must not hold the lock itself (its engine would wait for it), so it holds nothing.

The others run with ``KILN_QUIET_WAIT_S=0``: beside another test the machine is never quiet, so
their timings keep busy rounds at once (flagged) instead of waiting 30 s for a quiet that does
not come; ``alone`` and ``timed`` tests keep the default wait (the machine is quiet but for
themselves when they time).

The lock is the engine's own ``HostLock`` (a readers-writer ``flock`` plus a turnstile), at a path
named after xdist's run id, so every process of one run finds the same one; without xdist
(``-n 0``, a single process) nothing is locked.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.execute.host_lock import HOST_LOCK_ENV, HostLock
from evaluators._sessions import QUIET_WAIT_ENV


def run_lock(run_id: str) -> HostLock:
    return HostLock(Path(tempfile.gettempdir()) / f"kiln-pytest-{run_id}.lock")


@contextlib.contextmanager
def machine(run_id: str | None, alone: bool) -> Iterator[None]:
    """Hold the run's machine lock: exclusively for an ``alone`` test, else shared."""
    if not run_id:
        yield
        return
    lock = run_lock(run_id)
    with lock.exclusive() if alone else lock.shared():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    alone = item.get_closest_marker("alone") is not None
    timed = item.get_closest_marker("timed") is not None and not alone
    beside_others = bool(run_id) and not alone and not timed and QUIET_WAIT_ENV not in os.environ
    with contextlib.nullcontext() if timed else machine(run_id, alone), pytest.MonkeyPatch.context() as patch:
        if beside_others:
            patch.setenv(QUIET_WAIT_ENV, "0")
        if timed and run_id:
            patch.setenv(HOST_LOCK_ENV, str(run_lock(run_id).path))
        yield
