"""The Executor protocol holds for the local executor and for a third one written here (jobs in a
thread of the engine's process): both pass the executor conformance checks, and a workflow run
through the third one chooses what the local executor chooses."""

from __future__ import annotations

import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from engine_helpers import tiny_workflow, write_workflow

from engine.conformance import check_executor_members, check_executor_reports_a_failure, executor_conformance_tests
from engine.execute.executor import LocalExecutor
from engine.execute.protocol import Outcome
from engine.execute.worker import RUNNERS
from engine.plan.jobs import WorkOrder
from engine.run import run_workflow
from engine.store.store import Store
from engine.workflow import load_workflow


class ThreadExecutor:
    """Runs each job with the worker's own code in a thread of this process, one at a time (the
    worker changes the working directory): no process, no pool, no crash isolation."""

    local = True
    timing_holds_machine = True

    def __init__(self, store: Store) -> None:
        self.store = store
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="thread-executor")
        self._stopped = threading.Event()

    def default_workers(self) -> int | None:
        return None  # the engine's choice

    def warm(self, count: int) -> None:
        pass  # nothing to start

    def preload(self, libraries: list[str]) -> None:
        pass  # this process imports what the jobs need as they come

    def run(self, job: WorkOrder, timeout_s: float | None = None, alone: bool = False) -> Outcome:
        if job.python is not None:
            return Outcome(ok=False, error=f"this executor runs no job in another interpreter ({job.python})")
        future = self._thread.submit(self._run, job)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                return future.result(timeout=0.1)
            except TimeoutError:
                if self._stopped.is_set():
                    raise KeyboardInterrupt from None
                if deadline is not None and time.monotonic() > deadline:
                    return Outcome(ok=False, error=f"timed out after {timeout_s:g} s")

    def _run(self, job: WorkOrder) -> Outcome:
        staging, cwd = self.store.staging(job.kind), os.getcwd()
        try:
            return Outcome(ok=True, record=RUNNERS[job.kind](job.placed(self.store.root, staging), self.store))
        except Exception as error:  # noqa: BLE001 - whatever the job raised is its outcome
            return Outcome(ok=False, error=f"{type(error).__name__}: {error}")
        finally:
            os.chdir(cwd)
            shutil.rmtree(staging, ignore_errors=True)

    def stop(self) -> None:
        self._stopped.set()

    def close(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)


globals().update(executor_conformance_tests(ThreadExecutor, name="thread_executor"))
globals().update(executor_conformance_tests(LocalExecutor, name="local_executor"))


def test_a_workflow_run_by_a_third_executor_chooses_what_the_local_executor_chooses(tmp_path: Path, tiny_onnx: Path) -> None:
    workflow = tiny_workflow(tiny_onnx)
    workflow["evaluate"] = [{"id": "fidelity", "evaluator": "fidelity", "config": {"data": "rows"}}]
    workflow["select"] = {"objective": {"metric": "fidelity.max_abs_error", "goal": "min"}, "constraints": []}
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    local = run_workflow(resolved, Store(tmp_path / "local"))
    store = Store(tmp_path / "threads").ensure()
    threaded = run_workflow(resolved, store, executor=ThreadExecutor(store))
    assert threaded.stats.passes_run == local.stats.passes_run == 2
    assert threaded.stats.evals_run == local.stats.evals_run
    assert [r.label for r in threaded.results if r.chosen] == [r.label for r in local.results if r.chosen]
    assert [r.metrics["fidelity.max_abs_error"] for r in threaded.results] == [r.metrics["fidelity.max_abs_error"] for r in local.results]


class RaisingExecutor(ThreadExecutor):
    """Raises what a job raised instead of reporting it."""

    def _run(self, job: WorkOrder) -> Outcome:
        outcome = super()._run(job)
        if not outcome.ok:
            raise RuntimeError(outcome.error)
        return outcome


class NoWorkers(ThreadExecutor):
    def default_workers(self) -> int | None:
        return 0


def test_the_checks_catch_an_executor_that_raises_for_a_failed_job() -> None:
    with pytest.raises(AssertionError, match="a job that fails is an Outcome"):
        check_executor_reports_a_failure(RaisingExecutor)


def test_the_checks_catch_a_default_of_no_workers() -> None:
    with pytest.raises(AssertionError, match="default_workers"):
        check_executor_members(NoWorkers)
