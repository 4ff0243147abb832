"""A pool of warm worker processes: ``python -m engine.execute.worker --serve`` runs job after job.

A fresh process per job pays for Python and its heavy libraries (torch, transformers, openvino,
nncf, ...) every time; a pooled worker imports them once, in the background while the engine does
its first untimed work, and then runs jobs exactly as a one-shot worker does (same job file, same
result file, same store publishing, the job's output alone in the job's log).

Crash isolation is kept: a worker that dies (a segfault, ``os._exit``, killed) fails only the job it
was running, with the one-shot worker's message, and is not reused; the next job gets a fresh
worker. A timeout kills that worker's process group. ``close()`` (end of run, Ctrl-C) kills all.

What a job may leave behind, and the policy: the worker itself restores the working directory,
``os.environ``, ``sys.path`` (what a job added stays: libraries put their own folders there), ``sys.argv``, the SIGINT/SIGTERM handlers and torch's thread count
after each job (engine.execute.worker). A worker is recycled (ended, not reused) after a job that failed
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

#: how long a timing job waits for idle workers to finish their imports before it starts anyway
SETTLE_TIMEOUT_S = 30.0

#: distribution names whose module is named otherwise
_MODULES = {
    "onnxruntime-gpu": "onnxruntime",
    "onnxruntime-openvino": "onnxruntime",
    "onnxruntime-genai": "onnxruntime_genai",
    "scikit-learn": "sklearn",
    "pillow": "PIL",
}


def preload_modules(libraries: Iterable[str]) -> list[str]:
    """The importable modules of ``libraries`` (distribution names, or dotted module names), in
    order, once each. Only a top-level package is looked up here: finding a submodule would import
    its package into the engine."""
    modules: list[str] = []
    for library in libraries:
        module = library if "." in library else _MODULES.get(library, library.replace("-", "_"))
        if module in modules:
            continue
        try:
            found = importlib.util.find_spec(module.split(".")[0]) is not None
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
            [python, "-m", "engine.execute.worker", "--serve", str(self.current)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # each job's output goes to its own log (the worker redirects)
            env=env,
            start_new_session=True,
        )
        self.jobs = 0
        self.recycle = False
        #: preload requests not yet answered: the worker answers "ready" for each once its list is done
        self.owed = 1 if env.get("KILN_PRELOAD") else 0
        self._reply = b""

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
            self.owed += 1
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
        return self._wait_for((b"done", b"recycle"), timeout_s, stop)

    @property
    def preloading(self) -> bool:
        """Still importing libraries for later jobs."""
        return self.owed > 0

    def wait_ready(self, timeout_s: float) -> None:
        """Until this idle worker has imported what it was asked to preload (or ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        try:
            while self.preloading:
                if self._wait_for((b"ready",), max(0.0, deadline - time.monotonic()), None) is not None:
                    return  # it died
        except TimeoutError:
            pass

    def _wait_for(self, wanted: tuple[bytes, ...], timeout_s: float | None, stop: threading.Event | None) -> int | None:
        """Read reply lines until one of ``wanted``; "ready" lines on the way end ``preloading``."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            while b"\n" in self._reply:
                line, self._reply = self._reply.split(b"\n", 1)
                if line == b"ready":
                    self.owed = max(0, self.owed - 1)
                if line in wanted:
                    if line != b"ready":
                        self.recycle = line == b"recycle" or self.jobs >= MAX_JOBS
                    return None
            step = 0.25 if deadline is None else max(0.0, min(0.25, deadline - time.monotonic()))
            ready, _, _ = select.select([fd], [], [], step)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:  # the worker is gone
                    self.owed = 0
                    return self.process.wait()
                self._reply += chunk
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
        if not modules or self.env.get("KILN_PRELOAD") == ",".join(modules):
            return  # nothing, or what the workers were already asked for (a new store asks early)
        with self._lock:
            self.env = {**self.env, "KILN_PRELOAD": ",".join(modules)}
            for worker in self._idle:
                worker.preload(modules)

    def settle(self, timeout_s: float, skip: PooledWorker | None = None) -> None:
        """Wait (at most ``timeout_s`` in all) until no idle worker but ``skip`` is still preloading."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            busy = [worker for worker in self._idle if worker.preloading and worker is not skip]
        for worker in busy:  # idle, and the gate runs nothing else: no other thread reads its replies
            worker.wait_ready(max(0.0, deadline - time.monotonic()))

    def acquire(self, alone: bool = False) -> PooledWorker:
        """An idle worker, or a new one. A job takes one that has imported all the run's libraries
        if there is one (else the last one back: it has imported most of what jobs need): the one
        that ran the previous job may not have imported this job's libraries yet. ``alone`` (a
        timing job, which runs with nothing else beside it): a worker still importing for later
        jobs is taken if there is one (the job waits only for the import under way, and the worker
        imports nothing while it runs), and the other idle workers are waited for until their
        imports are done, so that none takes a core from the timing."""
        with self._lock:
            for dead in [worker for worker in self._idle if not worker.alive()]:
                self._drop(dead)
            if self._idle:
                for idle in self._idle:  # replies that came meanwhile (no other thread reads an idle worker's)
                    idle.wait_ready(0.0)
                preloading = [worker for worker in self._idle if worker.preloading]
                done = [worker for worker in self._idle if not worker.preloading]
                chosen = preloading if alone else done
                worker = chosen[-1] if chosen else self._idle[-1]
                self._idle.remove(worker)
            else:
                worker = PooledWorker(self.python, self.env, self.links)
                self._all.add(worker)
        if alone:
            self.settle(SETTLE_TIMEOUT_S, skip=worker)
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
