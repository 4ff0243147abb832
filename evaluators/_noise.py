"""How busy the machine is while a timing runs: CPU time used by other processes, and time the
hypervisor stole, measured from the kernel's counters (psutil) around each timed stretch.

A latency measured while another process takes a core measures the contention, not the model.
The latency evaluator re-measures a stretch that was busy after waiting for quiet, and records
these figures with every measurement so a summary can say which were taken under load.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Load:
    """CPU used by others and stolen, in cores (1.0 = one core fully), over ``seconds``."""

    others_cores: float
    steal_cores: float
    seconds: float

    def busy(self, threshold_cores: float) -> bool:
        return self.others_cores + self.steal_cores > threshold_cores


class NoiseMeter:
    """``start()`` then ``stop()`` gives the load of everything but this process in between.

    System-wide busy time minus this process's own CPU time (all its threads: a runtime's thread
    pool included) is what the rest of the machine used. Children are not subtracted: a timing
    worker starts none.
    """

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._process = psutil.Process()
        self._mark: tuple[float, float, float, float] | None = None

    def _now(self) -> tuple[float, float, float, float]:
        system = self._psutil.cpu_times()
        idle = system.idle + getattr(system, "iowait", 0.0)
        steal = getattr(system, "steal", 0.0)
        busy = sum(system) - idle - steal - getattr(system, "guest", 0.0) - getattr(system, "guest_nice", 0.0)
        own = self._process.cpu_times()
        return time.perf_counter(), busy, steal, own.user + own.system

    def start(self) -> None:
        self._mark = self._now()

    def stop(self) -> Load:
        if self._mark is None:
            raise RuntimeError("NoiseMeter.stop() before start()")
        wall0, busy0, steal0, own0 = self._mark
        wall1, busy1, steal1, own1 = self._now()
        seconds = max(wall1 - wall0, 1e-9)
        # the kernel's counters tick at 100 Hz: over short stretches the difference can dip below zero
        others = max(0.0, (busy1 - busy0) - (own1 - own0)) / seconds
        return Load(others_cores=others, steal_cores=max(0.0, steal1 - steal0) / seconds, seconds=seconds)

    def wait_for_quiet(self, threshold_cores: float, budget_s: float, window_s: float = 0.5) -> tuple[bool, float]:
        """Sleep in ``window_s`` steps until a window is quiet or ``budget_s`` is spent.
        Returns (quiet, seconds waited)."""
        waited = 0.0
        while True:
            self.start()
            time.sleep(window_s)
            load = self.stop()
            waited += load.seconds
            if not load.busy(threshold_cores):
                return True, waited
            if waited >= budget_s:
                return False, waited
