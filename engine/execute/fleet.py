"""Several workflows as one pool: one executor and one gate shared by every workflow's runner.

``engine run A.yaml B.yaml`` (engine.cli.fleet) runs each workflow in its own thread over one
store, every one through a ``SharedExecutor``: at most ``workers`` jobs at once across all of
them, a timing job alone on the machine (or, on a cluster, alone on its node: the executor's own
business) whichever workflow it belongs to. A job two workflows share (the same key) runs once:
the store's lock per key makes the second wait and take the first one's record.
"""

from __future__ import annotations

import threading
from typing import Any

from engine.execute.gate import Gate
from engine.execute.protocol import Executor, Outcome
from engine.plan.jobs import WorkOrder
from engine.store.store import Store


class SharedExecutor:
    """An ``Executor`` (engine.execute.protocol) handing every workflow's jobs to ``inner``
    through one ``gate``. ``close`` does nothing: the fleet closes ``inner`` once all are done."""

    #: the shared gate holds timing jobs itself, so each workflow's own gate never does
    timing_holds_machine = False

    def __init__(self, inner: Executor, store: Store, workers: int, exclusive_timing: bool = True) -> None:
        self.inner = inner
        self.store = store
        self.gate = Gate(workers, exclusive_timing and inner.timing_holds_machine)
        self._warmed = threading.Event()

    @property
    def local(self) -> bool:
        return self.inner.local

    @property
    def where(self) -> str:
        return str(getattr(self.inner, "where", "the executor's nodes"))

    def nodes(self) -> Any:
        nodes = getattr(self.inner, "nodes", None)
        return nodes() if callable(nodes) else []

    def default_workers(self) -> int | None:
        return self.gate.workers

    def warm(self, count: int) -> None:
        if not self._warmed.is_set():
            self._warmed.set()
            self.inner.warm(self.gate.workers)

    def preload(self, libraries: list[str]) -> None:
        self.inner.preload(libraries)  # each workflow's runtimes, imported by the idle workers

    def run(self, job: WorkOrder, timeout_s: float | None = None, alone: bool = False) -> Outcome:
        with self.gate.exclusive() if alone else self.gate.shared():
            # another workflow may have built it while this one waited for its turn
            record = self.store.lookup(job.key)
            if record is not None:
                return Outcome(ok=True, record=record, shared=True)
            return self.inner.run(job, timeout_s=timeout_s, alone=alone)

    def stop(self) -> None:
        self.inner.stop()

    def close(self) -> None:
        """Nothing here: other workflows of the fleet may still be running."""
