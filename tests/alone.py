"""Tests that assert on measured speed run alone, also when the suite runs on several processes.

pyproject's addopts run the suite with pytest-xdist, one test process per core. A test that times
models and asserts on the comparison (an example's choice, a paired interval, an overlap of two
timings) would then share the cores with another test and measure that test's load. Such a test
is marked ``alone``: for its setup, call and teardown it holds the run's lock exclusively, every
other test holds it shared, so nothing runs beside it and the rest still run side by side.
The others run with ``KILN_QUIET_WAIT_S=0``: beside another test the machine is never quiet, so
their timings keep busy rounds at once (flagged) instead of waiting 30 s for a quiet that does
not come; an ``alone`` test keeps the default wait (the machine is quiet but for itself).

The lock is two ``flock`` files named after xdist's run id (every process of one run finds the
same ones): a readers-writer lock, plus a turnstile that a waiting ``alone`` test holds, so the
other processes cannot starve it by taking the shared lock test after test. ``flock`` is used
directly because no locking library in the environment offers a readers-writer lock across
processes; without xdist (``-n 0``, a single process) nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from evaluators._sessions import QUIET_WAIT_ENV


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def machine(run_id: str | None, alone: bool) -> Iterator[None]:
    """Hold the run's machine lock: exclusively for an ``alone`` test, else shared."""
    if not run_id:
        yield
        return
    base = Path(tempfile.gettempdir()) / f"kiln-pytest-{run_id}"
    turnstile, shared = base.with_suffix(".turnstile"), base.with_suffix(".lock")
    with contextlib.ExitStack() as held:
        with _flock(turnstile, fcntl.LOCK_EX):
            held.enter_context(_flock(shared, fcntl.LOCK_EX if alone else fcntl.LOCK_SH))
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    alone = item.get_closest_marker("alone") is not None
    beside_others = bool(run_id) and not alone and QUIET_WAIT_ENV not in os.environ
    with machine(run_id, alone), pytest.MonkeyPatch.context() as patch:
        if beside_others:
            patch.setenv(QUIET_WAIT_ENV, "0")
        yield
