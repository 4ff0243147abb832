"""The Executor protocol: what the engine asks of whatever runs its jobs, and the ``Outcome`` it
gets back. ``LocalExecutor`` (engine.execute.executor: worker processes on this machine) and
``RayExecutor`` (engine.execute.ray_executor: Ray tasks on a cluster) implement it;
engine.conformance checks any executor against it (``executor_conformance_tests``).

The engine calls an executor in this order: ``default_workers`` (when ``--workers`` is not given),
``warm``, ``preload`` (only when the run has work the store cannot serve), ``run`` from several
threads at once for as long as the search goes on, ``stop`` if the run is interrupted meanwhile,
and ``close`` once it is over, whatever happened.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from engine.plan.jobs import WorkOrder


@dataclass
class Outcome:
    """What became of one job: ``ok`` with the ``record`` the worker filed in the store, or not
    ``ok`` with the ``error`` a person reads (why it failed: the plugin's message, the signal the
    worker died of, the timeout). ``log``: the job's output, where there is one."""

    ok: bool
    record: dict[str, Any] | None = None
    error: str | None = None
    log: Path | None = None
    shared: bool = False  # another run built it while this one waited: nothing ran here
    #: where it ran: the node's ``id``, ``label`` and ``host``, and ``began``/``ended`` (epoch
    #: seconds, as the node's clock says); None where the executor does not say
    node: dict[str, Any] | None = None


@runtime_checkable
class Executor(Protocol):
    """Runs the engine's jobs (passes, evaluations, dataset reads) somewhere, each as a worker
    would (``python -m engine.execute.worker``: the job's output published into the store, its
    record filed under its key) and says how each one ended. How many jobs run at once is not
    the executor's business: the engine's gate (engine.execute.gate) hands it at most that many."""

    @property
    def local(self) -> bool:
        """Whether jobs run on this machine, in its memory: the engine then runs no more jobs at
        once by default than the memory available holds for the input model's size
        (``executor.memory_workers``). False for a cluster, whose nodes have their own memory."""
        ...

    @property
    def timing_holds_machine(self) -> bool:
        """Whether a timing job (a latency measurement) shares hardware with the other jobs this
        executor runs, so that the engine must run it with no other job beside it (unless the user
        asks for overlap, ``--overlap-timing``). True for this machine; False where every job
        has hardware of its own, or where the executor itself gives a timing job a node alone
        (``alone``) and runs other jobs on the other nodes meanwhile (Ray)."""
        ...

    def default_workers(self) -> int | None:
        """How many jobs to run at once when the user gives no ``--workers``: a positive number
        (locally one per core, at most 4; on Ray the cluster's CPUs), or None for the engine's
        choice, one at a time. Called once, before ``warm``; it may ask a cluster, not run jobs."""
        ...

    def warm(self, count: int) -> None:
        """Get ready to run ``count`` jobs at once (start pooled workers, say) while the engine reads
        the workflow, hashes and plans. Called once before any ``run``; it must return at once
        (the work goes on in the background) and may do nothing."""
        ...

    def preload(self, libraries: list[str]) -> None:
        """What the run's jobs will import (distribution names such as ``onnxruntime``, or dotted
        module names: ``prestart.run_libraries``), for idle workers to import ahead of their first
        job. Called at most once, after ``warm`` and before the first ``run``, only when the run
        has jobs the store cannot serve; a name that is not installed is to be ignored. It must
        return at once and may do nothing."""
        ...

    def run(self, job: WorkOrder, timeout_s: float | None = None, alone: bool = False) -> Outcome:
        """Run ``job`` and wait for it to end. Called from several engine threads at once (as
        many as run jobs at once, and the one that reads datasets), so it must be thread-safe.

        The executor places the job (``job.placed(store.root, staging)``, with a fresh
        ``store.staging(job.kind)`` folder) and runs it as the worker does; when ``ok``, the
        job's record is filed in the store under ``job.key`` (``store.lookup(job.key)`` serves it)
        and its output is published there, and ``record`` is what the worker returned. A job
        another run sharing the store builds meanwhile may be waited for: ``shared=True``.

        Everything that happens to the job is an ``Outcome`` with ``ok=False`` and an ``error``,
        never an exception: the plugin raising, the worker crashing or being killed, the job
        running past ``timeout_s`` seconds (None: no limit; the job is then stopped). An exception
        means the run cannot go on (it was interrupted: ``KeyboardInterrupt`` after ``stop``; the
        cluster is gone) and ends the run.

        ``alone``: a timing job (unless the user let timing overlap). Where ``timing_holds_machine``
        is True the gate already runs it with no other job beside it, and the executor keeps its
        own background work (idle workers importing) from running beside it; where it is False,
        the executor gives it hardware of its own (a cluster: a node with nothing else on it)."""
        ...

    def stop(self) -> None:
        """The run was interrupted: the ``run`` calls under way in other threads are to end soon,
        taking their jobs down, by raising ``KeyboardInterrupt``. Called from another thread
        while they wait; it must not block. ``close`` follows."""
        ...

    def close(self) -> None:
        """The run is over (finished, failed or interrupted): end whatever the executor started
        (workers, processes). Called once per run, last; calling it again does nothing."""
        ...
