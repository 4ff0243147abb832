"""A pool of warm worker processes: ``python -m engine.worker --serve`` runs job after job.

A fresh process per job pays for Python and its heavy libraries (torch, transformers, openvino,
nncf, ...) every time; a pooled worker imports them once, in the background while the engine does
its first untimed work, and then runs jobs exactly as a one-shot worker does (same job file, same
result file, same store publishing, the job's output alone in the job's log).

Crash isolation is kept: a worker that dies (a segfault, ``os._exit``, killed) fails only the job it
was running, with the one-shot worker's message, and is not reused; the next job gets a fresh
worker. A timeout kills that worker's process group. ``close()`` (end of run, Ctrl-C) kills all.

What a job may leave behind, and the policy: the worker itself restores the working directory,
``os.environ``, ``sys.path`` (what a job added stays: libraries put their own folders there), ``sys.argv``, the SIGINT/SIGTERM handlers and torch's thread count
after each job (engine.worker). A worker is recycled (ended, not reused) after a job that failed
with an unexpected exception (a plugin's bug may leave broken state behind) and after
``MAX_JOBS`` jobs. Jobs for another interpreter (isolated environments) run one-shot.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

#: a worker serves at most this many jobs, then is replaced (bounds what leaks between jobs)
MAX_JOBS = 32

#: distribution names whose module is named otherwise
_MODULES = {
    "onnxruntime-gpu": "onnxruntime",
    "onnxruntime-openvino": "onnxruntime",
    "onnxruntime-genai": "onnxruntime_genai",
    "scikit-learn": "sklearn",
    "pillow": "PIL",
}


def preload_modules(libraries: Iterable[str]) -> list[str]:
    """The importable modules of ``libraries`` (distribution names), in order, once each."""
    modules: list[str] = []
    for library in libraries:
        module = _MODULES.get(library, library.replace("-", "_"))
        if module in modules:
            continue
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if found:
            modules.append(module)
    return modules


class PooledWorker:
    """One serving worker: jobs go in on its stdin, "done" comes back on its stdout. Its last
    argument is a link to the job file it runs (as a one-shot worker's is the job file), so
    ``ps`` and tools that look at workers see which job each one is on."""

    def __init__(self, python: str, env: dict[str, str], links: Path) -> None:
        self.current = links / f"worker-{uuid.uuid4().hex[:12]}.json"
        self.process = subprocess.Popen(
            [python, "-m", "engine.worker", "--serve", str(self.current)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # each job's output goes to its own log (the worker redirects)
            env=env,
            start_new_session=True,
        )
        self.jobs = 0
        self.recycle = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def preload(self, modules: list[str]) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write((json.dumps({"preload": modules}) + "\n").encode())
            self.process.stdin.flush()
        except OSError:  # it died: the next job finds out
            pass

    def send(self, job_file: str, log_path: str, deadline: float | None) -> None:
        assert self.process.stdin is not None
        link = self.current.with_suffix(".tmp")
        link.unlink(missing_ok=True)
        os.symlink(job_file, link)
        os.replace(link, self.current)
        line = json.dumps({"job": job_file, "log": log_path, "deadline": deadline}) + "\n"
        self.process.stdin.write(line.encode())
        self.process.stdin.flush()
        self.jobs += 1

    def wait_done(self, timeout_s: float | None, stop: threading.Event | None) -> int | None:
        """None once the job is done; the exit code if the worker died meanwhile. Raises
        TimeoutError at ``timeout_s`` and KeyboardInterrupt when ``stop`` is set."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        reply = b""
        while True:
            step = 0.25 if deadline is None else max(0.0, min(0.25, deadline - time.monotonic()))
            ready, _, _ = select.select([fd], [], [], step)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:  # the worker is gone
                    return self.process.wait()
                reply += chunk
                if reply.endswith(b"\n"):
                    self.recycle = b"recycle" in reply or self.jobs >= MAX_JOBS
                    return None
                continue
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass


class WorkerPool:
    """Idle serving workers for one interpreter; a job takes one (or a new one) and gives it back."""

    def __init__(self, python: str, env: dict[str, str]) -> None:
        self.python = python
        self.env = env
        self._idle: list[PooledWorker] = []
        self._all: set[PooledWorker] = set()
        self._lock = threading.Lock()
        self.closed = False
        self.links = Path(tempfile.mkdtemp(prefix="kiln-workers-"))

    def warm(self, count: int) -> None:
        """Start ``count`` workers now (Python and the engine imported while the engine plans)."""
        with self._lock:
            while len(self._all) < count:
                worker = PooledWorker(self.python, self.env, self.links)
                self._all.add(worker)
                self._idle.append(worker)

    def preload(self, modules: list[str]) -> None:
        """Have the idle workers, and every worker started from now on, import ``modules`` while
        no job waits for them."""
        if not modules:
            return
        with self._lock:
            self.env = {**self.env, "KILN_PRELOAD": ",".join(modules)}
            for worker in self._idle:
                worker.preload(modules)

    def acquire(self) -> PooledWorker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()  # the last one back: it has imported most of what jobs need
                if worker.alive():
                    return worker
                self._drop(worker)
            worker = PooledWorker(self.python, self.env, self.links)
            self._all.add(worker)
            return worker

    def release(self, worker: PooledWorker) -> None:
        """Back to the pool, unless it died, asked to be recycled or the pool closed."""
        with self._lock:
            if worker.alive() and not worker.recycle and not self.closed:
                self._idle.append(worker)
                return
        self.discard(worker)

    def discard(self, worker: PooledWorker) -> None:
        worker.kill()
        with self._lock:
            self._drop(worker)

    def _drop(self, worker: PooledWorker) -> None:
        self._all.discard(worker)
        if worker in self._idle:
            self._idle.remove(worker)

    def close(self) -> None:
        """Kill every worker, busy or idle (the run ended or was interrupted)."""
        with self._lock:
            self.closed = True
            workers = list(self._all)
            self._all.clear()
            self._idle.clear()
        for worker in workers:
            worker.kill()
        shutil.rmtree(self.links, ignore_errors=True)
