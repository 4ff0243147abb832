"""One run of a workflow: datasets, then the search (which processes candidates), then selection.
Every arrow of the flow is a function; the CLI only renders what they return."""

from __future__ import annotations

import time

from engine.execute.environments import prepare
from engine.execute.executor import LocalExecutor, memory_workers
from engine.execute.hooks import Hooks
from engine.execute.prestart import run_libraries
from engine.execute.protocol import Executor
from engine.execute.runner import Runner
from engine.execute.runoff import run_runoffs
from engine.search.search import search
from engine.select.front import select_all
from engine.select.results import RunReport
from engine.select.select import path_bytes
from engine.store.store import Store
from engine.workflow.resolve import ResolvedWorkflow, fetch_input
from engine.workflow.resolve.model_checks import check_fetched_input


def run_workflow(
    resolved: ResolvedWorkflow,
    store: Store,
    hooks: Hooks | None = None,
    executor: Executor | None = None,
    workers: int | None = None,
    exclusive_timing: bool = True,
) -> RunReport:
    """Run the search the workflow asks for (cache first), then rank the candidates. ``executor``
    runs the jobs (engine.execute.protocol; None: worker processes on this machine). ``workers``:
    how many jobs at once (None: the executor's default: locally one per core, at most 4 and as
    many as the memory available holds for the input model's size; the cluster's CPUs on Ray)."""
    started = time.perf_counter()
    fetch_hub_input(resolved, hooks)
    store.ensure().clean_stale_staging()  # what killed runs left half-written
    executor = executor if executor is not None else LocalExecutor(store)
    if workers is None:
        workers = executor.default_workers() or 1  # None: one at a time
        if executor.local:  # as many as this machine's memory holds
            workers = min(workers, memory_workers(path_bytes(resolved.input.path)))
    executor.warm(workers)  # pooled workers start while the engine prepares, hashes and plans
    try:
        prepare(resolved, store.root, build=True, hooks=hooks)  # before any job: its targets are checked in them
        runner = Runner(resolved, store, hooks, executor, workers=workers, exclusive_timing=exclusive_timing)
        if has_work(runner):  # a re-run served by the store imports nothing
            executor.preload(run_libraries(resolved))
        runner.materialize_datasets()
        try:
            search(runner)
            run_runoffs(runner)  # the tied leaders timed again, paired, before the final selection
        finally:
            runner.datasets_done()
    finally:
        executor.close()
    report = runner.report(started)
    select_all(resolved, report.results)
    return report


def fetch_hub_input(resolved: ResolvedWorkflow, hooks: Hooks | None) -> None:
    """Download what the Hugging Face cache lacks of a Hub input model (validate and plan only
    look); its commit was fixed when the workflow was read, so the run uses the commit they showed."""
    hub = resolved.input.hub
    if hub is None or hub.present:
        return
    hooks = hooks if hooks is not None else Hooks()
    hooks.model_download_started(hub.repo_id, hub.commit, len(hub.files))
    began = time.perf_counter()
    resolved.input = fetch_input(resolved.input, resolved.file)
    hooks.model_download_done(hub.repo_id, hub.commit, time.perf_counter() - began)
    check_fetched_input(resolved)  # its config.json is here now: the kind of model against the steps


def has_work(runner: Runner) -> bool:
    """Whether a dataset or a first pass is missing from the store (a cold or changed run). The
    plan makes its jobs as candidates are asked for: the references' first jobs are asked here
    (the search asks for the same ones first)."""
    read_first = [name for name, entry in runner.resolved.datasets.items() if not entry.cls.needs_signature]
    if any(runner.store.lookup(runner.datasets.keys[name]) is None for name in read_first):
        return True
    for target in list(runner.plan.spaces):
        reference = runner.plan.reference(target)
        if reference is None or not reference.jobs:
            return True  # the input runs as it is: whether its candidates' passes are stored is not known yet
        if runner.store.lookup(runner.job_key(reference.jobs[0], runner.input.digest)[0]) is None:
            return True
    return False
