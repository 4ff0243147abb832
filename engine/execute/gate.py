"""How much runs at once: up to N jobs share the machine; a timing job has it to itself.

On a 2-core machine a latency measured next to a running pass measures the pass, not the
model, so timing evaluations take the gate exclusively unless the user opts out (or the executor
gives every job hardware of its own: ``Executor.timing_holds_machine``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Gate:
    def __init__(self, workers: int = 1, exclusive_timing: bool = True) -> None:
        self.workers = max(1, workers)
        self.exclusive_timing = exclusive_timing
        self._cond = threading.Condition()
        self._running = 0
        self._exclusive = False
        self._waiting_exclusive = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            # waiting timing jobs go first, so a stream of passes cannot starve a measurement
            self._cond.wait_for(lambda: not self._exclusive and not self._waiting_exclusive and self._running < self.workers)
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        if not self.exclusive_timing:
            with self.shared():
                yield
            return
        with self._cond:
            self._waiting_exclusive += 1
            self._cond.wait_for(lambda: not self._exclusive and self._running == 0)
            self._waiting_exclusive -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()
