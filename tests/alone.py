"""Tests that assert on measured speed run alone, also when the suite runs on several processes.

pyproject's addopts run the suite with pytest-xdist, one test process per core. A test that times
models and asserts on the comparison (an example's choice, a paired interval, an overlap of two
timings) would then share the cores with another test and measure that test's load. Such a test
is marked ``alone``: for its setup, call and teardown it holds the run's lock exclusively, every
other test holds it shared, so nothing runs beside it and the rest still run side by side.
The others run with ``KILN_QUIET_WAIT_S=0``: beside another test the machine is never quiet, so
their timings keep busy rounds at once (flagged) instead of waiting 30 s for a quiet that does
not come; an ``alone`` test keeps the default wait (the machine is quiet but for itself).

Holding the machine only for an example's timing jobs (its engine given ``KILN_HOST_LOCK`` =
this lock, its exports and quantizations beside other tests) was tried and is slower here: the
examples' engines already keep both cores busy with two jobs, so beside another test every
pass took longer (bert-cpu 458 s -> 675 s, the whole suite 2,662 s -> 2,915 s), and the load
they put beside other tests broke the Ray tests' overlap windows.

The lock is the engine's own ``HostLock`` (engine.execute.host_lock: a readers-writer ``flock``
plus a turnstile that a waiting ``alone`` test holds, so the other processes cannot starve it),
at a path named after xdist's run id, so every process of one run finds the same one; without
xdist (``-n 0``, a single process) nothing is locked.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.execute.host_lock import HostLock
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


class _Held:
    """The exclusive hold kept from one ``alone`` test to the next one of this process."""

    stack: contextlib.ExitStack | None = None

    @classmethod
    def take(cls, run_id: str | None) -> None:
        if cls.stack is None:
            stack = contextlib.ExitStack()
            stack.enter_context(machine(run_id, alone=True))
            cls.stack = stack

    @classmethod
    def release(cls) -> None:
        stack, cls.stack = cls.stack, None
        if stack is not None:
            stack.close()


def _is_alone(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("alone") is not None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """An ``alone`` test followed by another (a file of them) keeps the machine for the next
    one: taking the lock waits for the test running beside it to end, and a file of 13 such
    tests left the other process idle 13 times over for that."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    alone = _is_alone(item)
    beside_others = bool(run_id) and not alone and QUIET_WAIT_ENV not in os.environ
    try:
        with machine(run_id, alone=False) if not alone else contextlib.nullcontext(), pytest.MonkeyPatch.context() as patch:
            if alone:
                _Held.take(run_id)
            if beside_others:
                patch.setenv(QUIET_WAIT_ENV, "0")
            yield
    finally:
        if not (alone and _is_alone(nextitem)):
            _Held.release()
