"""Running jobs in worker processes: crash, timeout and Ctrl-C handling live here, nowhere else."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from engine.execute.nodes import Node, host_node
from engine.execute.pool import WorkerPool, preload_modules
from engine.execute.prestart import MAX_DEFAULT_WORKERS, adopt_prestarted, local_workers, pooling_enabled, worker_env
from engine.execute.protocol import Outcome
from engine.plan.jobs import WorkOrder
from engine.store.locks import job_lock
from engine.store.store import Store, write_json_atomic


def _tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").rstrip().splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


TIMED_OUT = "timed out"
#: a worker enforces its own deadline this long after the engine's, which normally comes first
WORKER_GRACE_S = 10.0


def worker_deadline(timeout_s: float | None) -> float | None:
    """When a worker stops a job by itself (a little after the engine would have)."""
    return None if timeout_s is None else time.time() + timeout_s + WORKER_GRACE_S


def run_worker_process(
    python: str, job_file: str, log_path: str, timeout_s: float | None, stop: threading.Event | None = None
) -> int | str:
    """Run ``python -m engine.execute.worker JOB`` with its output in ``log_path``; its exit code, or
    TIMED_OUT after killing its whole process group. Used locally and inside Ray tasks. ``stop``
    set (the engine interrupted in another thread) kills the worker and raises KeyboardInterrupt."""
    env = worker_env()
    deadline = worker_deadline(timeout_s)
    if deadline is not None:
        env["KILN_DEADLINE"] = repr(deadline)
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(
            [python, "-m", "engine.execute.worker", job_file],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        try:
            return _wait(process, timeout_s, stop)
        except subprocess.TimeoutExpired:
            _kill(process)
            return TIMED_OUT
        except BaseException:  # Ctrl-C or the engine being stopped: take the worker down too
            _kill(process)
            raise


def _wait(process: subprocess.Popen[bytes], timeout_s: float | None, stop: threading.Event | None) -> int:
    if stop is None:
        return process.wait(timeout=timeout_s)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        step = 0.25 if deadline is None else max(0.0, min(0.25, deadline - time.monotonic()))
        try:
            return process.wait(timeout=step)
        except subprocess.TimeoutExpired:
            if stop.is_set():
                raise KeyboardInterrupt from None
            if deadline is not None and time.monotonic() >= deadline:
                raise


def _kill(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def run_pooled(
    pool: WorkerPool, job_file: str, log_path: str, timeout_s: float | None, stop: threading.Event | None, alone: bool = False
) -> int | str:
    """``run_worker_process`` in a warm worker of ``pool``: the same outcomes (a died worker's exit
    code, TIMED_OUT), 0 once the job is done; a worker that died or timed out is not reused.
    ``alone``: a timing job (``WorkerPool.acquire``)."""
    worker = pool.acquire(alone)
    try:
        try:
            worker.send(job_file, log_path, worker_deadline(timeout_s))
        except BrokenPipeError:  # it died while idle (killed from outside): the job goes to a fresh one
            pool.discard(worker)
            worker = pool.acquire()
            worker.send(job_file, log_path, worker_deadline(timeout_s))
        code = worker.wait_done(timeout_s, stop)
    except TimeoutError:
        pool.discard(worker)
        return TIMED_OUT
    except BaseException:  # Ctrl-C, the engine being stopped, a broken pipe: take the worker down too
        pool.discard(worker)
        raise
    if code is not None:
        pool.discard(worker)
        return code
    pool.release(worker)
    return 0


#: what one job may hold in memory, in multiples of the input model's size (the model, the copy a
#: pass writes, a runtime's session of it); the default worker count keeps that many within reach
JOB_MEMORY_FACTOR = 4


def memory_workers(model_bytes: int) -> int:
    """How many jobs on a model of ``model_bytes`` fit in the memory available now (at least one):
    a 7B decoder is not loaded by every core at once."""
    import psutil

    if model_bytes <= 0:
        return MAX_DEFAULT_WORKERS
    return max(1, int(psutil.virtual_memory().available // (JOB_MEMORY_FACTOR * model_bytes)))


#: the warm workers a process that runs jobs for others keeps (a Ray worker process: Ray reuses
#: it between tasks, so its pool stays warm from one job to the next)
_node_pool: WorkerPool | None = None
_NODE_POOL_LOCK = threading.Lock()


def run_on_node(python: str, job_file: str, log_path: str, timeout_s: float | None) -> int | str:
    """A job run for a remote executor (a Ray task): in a warm worker this process keeps, or in a
    fresh one with ``KILN_POOL=0``. Outcomes as ``run_worker_process``'s; a worker that crashed
    or timed out is replaced, so crashes stay isolated. Jobs for another interpreter (an isolated
    environment) get a fresh process, as locally."""
    global _node_pool
    if not pooling_enabled() or python != sys.executable:
        return run_worker_process(python, job_file, log_path, timeout_s)
    with _NODE_POOL_LOCK:
        if _node_pool is None or _node_pool.closed:
            _node_pool = WorkerPool(python, worker_env())
        pool = _node_pool
    return run_pooled(pool, job_file, log_path, timeout_s, None)


class LocalExecutor:
    """The ``Executor`` (engine.execute.protocol) of worker processes on this machine: warm pooled
    workers (engine.execute.pool) for this interpreter, a fresh process per job for others
    (isolated environments) or with ``KILN_POOL=0``. How many run at once is the gate's business
    (engine.execute.gate); the executor only runs what it is given."""

    def __init__(self, store: Store, python: str | None = None, pool: bool | None = None) -> None:
        self.store = store
        self.python = python or sys.executable
        self.logs = store.root / "logs"
        self._stop = threading.Event()
        self.pooled = pooling_enabled() if pool is None else pool
        self._pool: WorkerPool | None = None
        self._pool_lock = threading.Lock()
        self._where = threading.local()  # the node the calling thread's job ran on (``execute`` sets it)
        self.host = {"id": socket.gethostname(), "label": socket.gethostname(), "host": socket.gethostname()}

    def pool(self) -> WorkerPool:
        with self._pool_lock:
            if self._pool is None or self._pool.closed:
                self._pool = adopt_prestarted(self.python) or WorkerPool(self.python, worker_env())
            return self._pool

    #: jobs run on this machine, in its memory (a cluster's executor says False)
    local = True
    #: a timing job shares this machine's cores with every other job: it runs alone
    timing_holds_machine = True

    def default_workers(self) -> int:
        """How many jobs run at once without ``--workers`` (``local_workers``)."""
        return local_workers()

    def warm(self, count: int) -> None:
        """Start ``count`` pooled workers now, while the engine does its own first work."""
        if self.pooled:
            self.pool().warm(count)

    def preload(self, libraries: list[str]) -> None:
        """Have the pooled workers import ``libraries`` (distribution names) while they are idle."""
        if self.pooled:
            self.pool().preload(preload_modules(libraries))

    def stop(self) -> None:
        """Kill the workers other threads are waiting on (the run was interrupted); ``close``
        then ends the idle ones."""
        self._stop.set()

    def close(self) -> None:
        """End the pooled workers (the run is over); again, nothing more."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def execute(self, job: WorkOrder, job_file: Path, log_path: Path, timeout_s: float | None, alone: bool = False) -> int | str:
        python = job.python or self.python
        if self.pooled and python == self.python:
            return run_pooled(self.pool(), str(job_file), str(log_path), timeout_s, self._stop, alone)
        return run_worker_process(python, str(job_file), str(log_path), timeout_s, self._stop)

    def run(self, job: WorkOrder, timeout_s: float | None = None, alone: bool = False) -> Outcome:
        """Run ``job`` in a worker, unless another run sharing the store is building the same
        key: then wait for it and return its record. ``alone``: a timing job, which the gate lets
        run with no other job beside it; no idle worker may be importing beside it either."""
        with job_lock(self.store.root / "locks", job.key, timeout_s):
            # looked up again under the lock, waited or not: another run may have built the key and let
            # its lock go between this run's first look and now (a timing job waits at the gate in
            # between), and then the lock is taken at once, with nothing to say it was ever held
            record = self.store.lookup(job.key)
            if record is not None:
                return Outcome(ok=True, record=record, shared=True)
            self._where.node = None
            began = time.time()
            outcome = self._run(job, timeout_s, alone)
            outcome.node = self._where.node or {**self.host, "began": round(began, 3), "ended": round(time.time(), 3)}
            if job.environment is not None and "env" not in outcome.node:  # the driver built it before the run
                outcome.node["env"] = {"key": job.environment.key, "built": False, "python": job.environment.python}
            return outcome

    def nodes(self) -> list[Node]:
        """The nodes jobs may run on (engine.execute.nodes): this machine."""
        return [host_node()]

    #: how people call the nodes of ``nodes()``, in reasons a target is unavailable
    where = "this machine"

    def _run(self, job: WorkOrder, timeout_s: float | None, alone: bool = False) -> Outcome:
        staging = self.store.staging(job.kind)
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{job.key}.log"
        job = job.placed(self.store.root, staging)
        job_file = staging / "job.json"
        write_json_atomic(job_file, job.to_json())
        try:
            code = self.execute(job, job_file, log_path, timeout_s, alone)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if code == TIMED_OUT:
            shutil.rmtree(staging, ignore_errors=True)
            return Outcome(ok=False, error=f"timed out after {timeout_s:g} s (raise the step's timeout_s if it needs longer)", log=log_path)
        if isinstance(code, str):  # the executor could not run it (no node has what it asks for)
            shutil.rmtree(staging, ignore_errors=True)
            return Outcome(ok=False, error=code, log=log_path)
        try:
            outcome = json.loads((staging / "result.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            assert isinstance(code, int)
            why = f"the worker died with {_signal_name(code)}" if code < 0 else f"the worker exited with code {code} and no result"
            tail = _tail(log_path)
            shutil.rmtree(staging, ignore_errors=True)
            return Outcome(ok=False, error=why + (f"; its last output:\n{tail}" if tail else ""), log=log_path)
        shutil.rmtree(staging, ignore_errors=True)
        if outcome.get("ok"):
            return Outcome(ok=True, record=outcome["record"], log=log_path)
        error = outcome.get("error") or "unknown error"
        if outcome.get("traceback"):
            error += f" (traceback in {log_path})"
        return Outcome(ok=False, error=error, log=log_path)
