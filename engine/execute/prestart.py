"""Worker processes started first thing by ``engine run``, before the engine's own modules and
the workflow are read: Python and the engine load in them meanwhile, and they begin importing the
run's libraries as soon as it says which (``preload_prestarted``). The run's executor adopts them
(``adopt_prestarted``). This module imports nothing of the engine but ``engine.execute.pool`` (the
standard library only), so that the workers start as early as the command line is parsed.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from engine.execute.pool import WorkerPool, preload_modules

if TYPE_CHECKING:
    from engine.store.store import Store
    from engine.workflow.resolve import ResolvedWorkflow


def worker_env() -> dict[str, str]:
    """The environment of a worker process, one-shot or pooled."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env["KILN_PARENT_PID"] = str(os.getpid())  # the worker dies with this process (engine.execute.worker)
    env.pop("KILN_DEADLINE", None)
    env.pop("KILN_PRELOAD", None)
    return env


#: the most jobs run at once locally without ``--workers`` (each holds a model or two in memory)
MAX_DEFAULT_WORKERS = 4


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS says, else all)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def local_workers() -> int:
    """How many jobs run at once locally without ``--workers``: one per core this process may
    use, at most ``MAX_DEFAULT_WORKERS``. Passes are mostly single-threaded Python (imports, graph
    rewriting, a quantizer's loops), so two of them share two cores well, and a dataset is read
    while the first pass runs; timing evaluations still run alone (engine.execute.gate)."""
    return max(1, min(MAX_DEFAULT_WORKERS, usable_cores()))


def pooling_enabled() -> bool:
    """Warm workers unless ``KILN_POOL=0`` (every job in a fresh process, as before)."""
    return os.environ.get("KILN_POOL", "1") != "0"


#: workers started before the workflow was read (``prestarted``), for the run's executor to adopt
_prestarted: WorkerPool | None = None


@contextlib.contextmanager
def prestarted(count: int | None) -> Iterator[None]:
    """Start ``count`` pooled workers (None: ``local_workers()``; 0: none) on entering, before the
    workflow is read and the store opened: Python and the engine load in them meanwhile, and they
    begin importing the run's libraries as soon as it says which. The run's executor adopts them;
    on leaving, those it did not adopt (the run stopped before it began) are ended."""
    global _prestarted
    count = local_workers() if count is None else count
    if count > 0 and pooling_enabled() and _prestarted is None:
        _prestarted = WorkerPool(sys.executable, worker_env())
        _prestarted.warm(count)
    try:
        yield
    finally:
        pool = adopt_prestarted(sys.executable)
        if pool is not None:
            pool.close()


def preload_prestarted(libraries: list[str]) -> None:
    """Have the prestarted workers import ``libraries`` (see ``WorkerPool.preload``) now."""
    if _prestarted is not None:
        _prestarted.preload(preload_modules(libraries))


def adopt_prestarted(python: str) -> WorkerPool | None:
    """The prestarted pool, handed over once, if it runs ``python``."""
    global _prestarted
    pool, _prestarted = _prestarted, None
    if pool is not None and (pool.python != python or pool.closed):
        pool.close()
        return None
    return pool


def run_libraries(resolved: ResolvedWorkflow) -> list[str]:
    """What the run's jobs import (distribution names or dotted modules, see
    ``Pass.warm_modules``), roughly in the order they first need it."""
    steps = [
        s.pass_cls.warm_modules(resolved.input.format) for s in resolved.steps.values() if s.environment is None
    ]  # the others import in theirs
    groups = [
        *(getattr(e.cls, "libraries", ()) for e in resolved.datasets.values()),
        *steps,
        *(t.cls.warm_modules(resolved.input.format) for t in resolved.targets.values()),
        *(getattr(e.cls, "libraries", ()) for e in resolved.evaluators.values()),
    ]
    return list(dict.fromkeys(name for group in groups for name in group))


def preload_if_new(resolved: ResolvedWorkflow, store: Store) -> None:
    """A store with no record yet (a first run): nothing can come from it, so the prestarted
    workers (``prestarted``) start importing the run's libraries now, before the
    engine has hashed the input and planned."""
    if not store.has_records():
        preload_prestarted(run_libraries(resolved))
