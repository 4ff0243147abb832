"""One run of a workflow: datasets, then the search (which processes candidates), then selection.
Every arrow of the flow is a function; the CLI only renders what they return."""

from __future__ import annotations

import time
from typing import Any

from engine.environments import prepare
from engine.hooks import Hooks
from engine.results import RunReport
from engine.runner import Runner
from engine.search import search
from engine.select import select
from engine.store import Store
from engine.workflow.resolve import ResolvedWorkflow


def run_workflow(
    resolved: ResolvedWorkflow,
    store: Store,
    hooks: Hooks | None = None,
    executor: Any = None,
    workers: int = 1,
    exclusive_timing: bool = True,
) -> RunReport:
    """Run the search the workflow asks for (cache first), then rank the candidates."""
    started = time.perf_counter()
    store.ensure().clean_stale_staging()  # what killed runs left half-written
    prepare(resolved, store.root, build=True, hooks=hooks)  # before any job: its targets are checked in them
    runner = Runner(resolved, store, hooks, executor, workers=workers, exclusive_timing=exclusive_timing)
    warm = getattr(runner.executor, "warm", None)
    if warm is not None:  # pooled workers import the run's libraries while the engine hashes and plans
        warm(workers, run_libraries(resolved))
    try:
        runner.materialize_datasets()
        search(runner)
    finally:
        close = getattr(runner.executor, "close", None)
        if close is not None:
            close()
    report = runner.report(started)
    select(resolved, report.results)
    return report


def run_libraries(resolved: ResolvedWorkflow) -> list[str]:
    """The libraries the run's jobs import, roughly in the order they first need them."""
    groups = [
        [e.cls for e in resolved.datasets.values()],
        [s.pass_cls for s in resolved.steps.values()],
        [t.cls for t in resolved.targets.values()],
        [e.cls for e in resolved.evaluators.values()],
    ]
    return list(dict.fromkeys(lib for group in groups for cls in group for lib in getattr(cls, "libraries", ())))
