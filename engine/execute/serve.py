"""The serving loop of a pooled worker (``python -m engine.execute.worker --serve``, see engine.execute.pool).

Whenever no job is waiting it imports the next of the libraries it was asked to preload (a
``{"preload": [MODULE, ...]}`` line, or ``KILN_PRELOAD``: the run's libraries, in the order its jobs
need them; a job never waits for more than the one import under way), and answers ``ready`` on
its stdout once they are all imported (the engine waits for that before a timing job). It reads one job per line
on stdin — ``{"job": JOB.json, "log": LOG, "deadline": T}`` —
runs it as a one-shot worker would, with fds 1 and 2 redirected into the job's log so the log holds
that job's output alone, puts back what a job may have changed (working directory, environment,
``sys.path`` (entries added stay), ``sys.argv``, SIGINT/SIGTERM handlers, torch's thread count) and answers ``done`` on
its original stdout, or ``recycle`` after a job that failed with an unexpected exception (then it
exits: a plugin's bug may leave broken state behind), and after a job that left the worker more
than ``LEFT_BEHIND_BYTES`` larger than it found it once freed memory is given back (``malloc_trim``):
a large model's job leaves gigabytes in the allocator's arenas, which the next job, in the same
process, would add to its own peak (a 4 GB encoder's fusion was killed for memory in the worker
that had exported it).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import select
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: how long a worker that has just finished a job waits for the next one before it goes back to
#: its preloads (the engine sends the next job within a fraction of a second)
AFTER_JOB_S = 0.5
#: a worker whose resident memory grew by more than this over a job is ended, not reused
LEFT_BEHIND_BYTES = 1 << 30


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, looked up once (``find_library`` runs ``ldconfig``); None elsewhere."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


def resident_bytes() -> int | None:
    """This process's resident memory now (Linux's /proc), after giving freed heap memory back to
    the system (glibc's ``malloc_trim``; where neither exists, None: nothing is judged)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def preload(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - a library that fails to import fails the job that needs it, with its message
        return


def _torch_threads() -> int | None:
    torch = sys.modules.get("torch")
    try:
        return int(torch.get_num_threads()) if torch is not None else None
    except (AttributeError, RuntimeError):
        return None


@contextlib.contextmanager
def _output_to(log_path: str, idle: int) -> Iterator[None]:
    """fds 1 and 2 into ``log_path`` for the job, back to ``idle`` after it."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(idle, 1)
        os.dup2(idle, 2)


class _State:
    """What a job may change in this process, to put back after it."""

    def __init__(self) -> None:
        self.cwd = os.getcwd()
        self.environ = dict(os.environ)
        self.path = list(sys.path)
        self.argv = list(sys.argv)
        self.handlers = {number: signal.getsignal(number) for number in _SIGNALS}

    def restore(self, threads: int | None) -> None:
        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.environ)
        # entries a job added stay, after the ones it found: a library imported by the job may have
        # put its own folder on sys.path (onnxruntime.transformers does), and its modules imported
        # later, by another job, are found through it; only removals and reorderings are undone
        sys.path[:] = self.path + [entry for entry in sys.path if entry not in self.path]
        sys.argv[:] = self.argv
        for number, handler in self.handlers.items():
            if signal.getsignal(number) is not handler and handler is not None:
                signal.signal(number, handler)
        if threads is not None and _torch_threads() not in (None, threads):
            sys.modules["torch"].set_num_threads(threads)


class _Commands:
    """Job lines from stdin, read without blocking when asked (to import libraries meanwhile)."""

    def __init__(self) -> None:
        self.buffer = b""
        self.closed = False

    def next(self, wait: float | None) -> bytes | None:
        """The next line; None if none came within ``wait`` seconds (None: wait for one)."""
        while b"\n" not in self.buffer and not self.closed:
            ready, _, _ = select.select([0], [], [], wait)
            if not ready:
                return None
            chunk = os.read(0, 65536)
            self.closed = not chunk
            self.buffer += chunk
        if b"\n" not in self.buffer:
            return None
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line


def serve(run_job: Callable[[Path], dict[str, Any]], deadline: list[float | None]) -> int:
    control = os.fdopen(os.dup(1), "wb", buffering=0)  # replies go to the engine, never the job's output
    idle = os.open(os.devnull, os.O_WRONLY)
    os.dup2(idle, 1)
    os.dup2(idle, 2)
    pending = [module for module in os.environ.pop("KILN_PRELOAD", "").split(",") if module]
    owed = 1 if pending else 0  # preload requests to answer "ready" to once the list is done
    commands = _Commands()
    just_ran = False
    while True:
        if owed and not pending:  # every library asked for is imported: timing may start
            control.write(b"ready\n" * owed)
            owed = 0
        # right after a job the engine is about to send the next one: a moment's wait keeps an
        # import (up to seconds) from starting just before it, which the job would wait for
        line = commands.next(wait=None if not pending else (AFTER_JOB_S if just_ran else 0))
        just_ran = False
        if line is None and pending:  # no job waiting: import the next library the run will need
            preload(pending.pop(0))
            continue
        if line is None:
            return 0  # the engine closed the pipe
        message = json.loads(line)
        if "preload" in message:  # the run has work: the libraries it will need
            pending += [module for module in message["preload"] if module not in pending]
            owed += 1
            continue
        state, threads = _State(), _torch_threads()  # what the job finds, put back after it
        before = resident_bytes()
        with _output_to(message["log"], idle):
            deadline[0] = message.get("deadline")
            try:
                outcome = run_job(Path(message["job"]))
            finally:
                deadline[0] = None
        state.restore(threads)
        just_ran = True
        after = resident_bytes()
        recycle = "traceback" in outcome or (before is not None and after is not None and after - before > LEFT_BEHIND_BYTES)
        control.write(b"recycle\n" if recycle else b"done\n")
        if recycle:
            return 0
