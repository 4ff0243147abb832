"""How much runs at once: up to N jobs share the machine; a timing job has it to itself.

On a 2-core machine a latency measured next to a running pass measures the pass, not the
model, so timing evaluations take the gate exclusively unless the user opts out (or the executor
gives every job hardware of its own: ``Executor.timing_holds_machine``). A timing takes the machine
when it empties: until then the workers go on with the jobs that are ready (below). Runs that share the
machine with other runs keep their timings apart from those runs' jobs too when
``KILN_HOST_LOCK`` names a lock file they share (engine.execute.host_lock): a gate that holds
timing jobs alone then holds that file shared for each job, and exclusively for a timing job.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from engine.execute.host_lock import HostLock


class Gate:
    def __init__(self, workers: int = 1, exclusive_timing: bool = True, host: HostLock | None = None) -> None:
        self.workers = max(1, workers)
        self.exclusive_timing = exclusive_timing
        #: the machine-wide lock, where runs share one; only a gate that holds timing alone takes it
        #: (a fleet's workflows pass their timing jobs to the fleet's gate, which does)
        self.host = (host or HostLock.from_env()) if exclusive_timing else None
        self._cond = threading.Condition()
        self._running: dict[int, str | None] = {}  # the jobs running (by when they asked): their group
        self._exclusive = False
        self._waiting_exclusive = 0
        self._asked = 0
        self._queue: deque[tuple[int, str | None]] = deque()  # the jobs waiting to start, in the order they asked: (ask, group)

    def _may_share(self) -> bool:
        """A job may start on a free worker unless a timing job holds the machine, or waits for
        it and nothing runs. A waiting timing must wait for every running job anyway, so while
        one runs a free worker takes the next job instead of idling; the timing goes the moment
        the machine empties (the other jobs waiting then wait for it, and timings waiting
        together run back to back). A timing is a leaf of the plan, nothing waits on its figure
        but the choice and what is decided from it (a runoff, the sampler's next wave, a grid's
        next candidate: at most 2 per worker in flight), so putting it after the work that is
        ready costs no wall time, where idling a core does: the earlier rule (a timing waits
        for the jobs running when it came and one more, then nothing else starts) left one of
        the two cores idle 18-27 s of every cold bert-openvino.json run, OpenVINO's NNCF
        accuracy control ready and waiting behind a timing queued behind ONNX Runtime's
        accuracy-driven INT8. A stream of jobs holds a timing back only while ready work lasts:
        the plan's jobs are finite, and a grid or a sampler starts no new candidate until
        earlier ones have their figures."""
        if self._exclusive or len(self._running) >= self.workers:
            return False
        return not self._waiting_exclusive or bool(self._running)

    def _next(self) -> int:
        """The job that starts next: the one that asked first among those of the group with the
        fewest jobs running."""
        running = Counter(self._running.values())
        return min(self._queue, key=lambda entry: (running[entry[1]], entry[0]))[0]

    @contextmanager
    def shared(self, group: str | None = None) -> Iterator[None]:
        """Hold a worker's place. A free worker takes the job that asked first among those of the
        ``group`` (the runner's: the target whose candidate asked) with the fewest jobs running:
        first come, first served within a group, and each group its turn. Taken in whatever
        order the threads woke, a pass asked for early (bert-openvino.json's accuracy-driven
        INT8, 58 s, on the way to a timing) lost its turn to seven later jobs and ran last, alone
        on one core; first come, first served across targets, the same pass (ONNX Runtime's
        target, 40 s, the longest chain) still waited behind the OpenVINO target's three NNCF
        quantizations, asked a fraction of a second before it, and that run took 170 s against
        140-147 s for the runs where it started first. Jobs without a group are a group of their own."""
        with self._cond:
            asked = self._asked
            self._asked += 1
            self._queue.append((asked, group))
            try:
                self._cond.wait_for(lambda: self._next() == asked and self._may_share())
            finally:
                self._queue.remove((asked, group))
                self._cond.notify_all()  # the next in line may start too
            self._running[asked] = group
        try:
            with self.host.shared() if self.host is not None else nullcontext():
                yield
        finally:
            with self._cond:
                self._running.pop(asked, None)
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        if not self.exclusive_timing:
            with self.shared():
                yield
            return
        with self._cond:
            self._waiting_exclusive += 1
            self._cond.wait_for(lambda: not self._exclusive and not self._running)
            self._waiting_exclusive -= 1
            self._exclusive = True
        try:
            with self.host.exclusive() if self.host is not None else nullcontext():
                yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()
