"""The gate (engine.execute.gate): N jobs at once, a timing job alone, and while a timing job waits
for the running jobs to end, a free worker takes the next job: the timing goes when the machine
empties."""

from __future__ import annotations

import threading
import time

from holders import hold_in_thread

from engine.execute.gate import Gate

WAIT_S = 0.2


class Jobs:
    def __init__(self, gate: Gate) -> None:
        self.gate, self.log = gate, []
        self.release: dict[str, threading.Event] = {}
        self.threads: dict[str, threading.Thread] = {}

    def start(self, name: str, timing: bool = False) -> None:
        self.release[name] = threading.Event()
        held = self.gate.exclusive if timing else self.gate.shared
        self.threads[name] = hold_in_thread(held, self.log, name, self.release[name])
        time.sleep(WAIT_S)

    def end(self, name: str) -> None:
        self.release[name].set()
        self.threads[name].join(5)
        time.sleep(WAIT_S)

    def inside(self) -> set[str]:
        state: dict[str, bool] = {}
        for entry in self.log:
            name, _, where = entry.rpartition(" ")
            state[name] = where == "in"
        return {name for name, held in state.items() if held}


def test_a_free_worker_takes_jobs_while_a_timing_waits_for_the_running_ones() -> None:
    jobs = Jobs(Gate(2, host=None))
    jobs.start("long pass")
    jobs.start("timing", timing=True)
    assert jobs.inside() == {"long pass"}  # the timing waits for the pass
    jobs.start("quick pass")
    assert jobs.inside() == {"long pass", "quick pass"}  # the other core does not idle while the timing waits
    jobs.end("quick pass")
    jobs.start("next pass")
    assert jobs.inside() == {"long pass", "next pass"}
    jobs.end("long pass")
    jobs.start("late pass")
    # a job started after the timing came still runs: the timing waits for it anyway, so the free
    # worker takes the next job (the previous gate left it idle here until "next pass" ended)
    assert jobs.inside() == {"next pass", "late pass"}
    jobs.start("later pass")  # both workers busy: it waits, then takes the first free one
    jobs.end("next pass")
    assert jobs.inside() == {"late pass", "later pass"}
    jobs.end("late pass")
    jobs.end("later pass")
    assert jobs.inside() == {"timing"}  # the machine emptied: the timing has it to itself
    jobs.start("after")
    assert jobs.inside() == {"timing"}
    jobs.end("timing")
    assert jobs.inside() == {"after"}
    jobs.end("after")


def test_timing_jobs_waiting_together_run_back_to_back_before_the_next_job() -> None:
    jobs = Jobs(Gate(2, host=None))
    jobs.start("pass")
    jobs.start("timing 1", timing=True)
    jobs.start("timing 2", timing=True)
    jobs.end("pass")
    (first,) = jobs.inside()
    jobs.start("next pass")
    jobs.end(first)
    (second,) = jobs.inside()
    assert {first, second} == {"timing 1", "timing 2"}  # the queued job waits for both timings
    jobs.end(second)
    assert jobs.inside() == {"next pass"}
    jobs.end("next pass")


def test_with_one_worker_a_waiting_timing_goes_first() -> None:
    jobs = Jobs(Gate(1, host=None))
    jobs.start("pass")
    jobs.start("timing", timing=True)
    jobs.start("next pass")
    jobs.end("pass")
    assert jobs.inside() == {"timing"}
    jobs.end("timing")
    assert jobs.inside() == {"next pass"}
    jobs.end("next pass")


def test_jobs_start_in_the_order_they_asked() -> None:
    jobs = Jobs(Gate(1, host=None))
    jobs.start("running")
    waiting = [f"job {i}" for i in range(5)]
    for name in waiting:
        jobs.start(name)  # each asks while the one before it still waits
    jobs.end("running")
    for name in waiting:
        assert jobs.inside() == {name}  # taken in whatever order the threads woke: 1 in 120 runs would pass
        jobs.end(name)


def test_a_free_worker_takes_the_next_job_of_the_target_with_the_fewest_running() -> None:
    # the OpenVINO target's three quantizations asked first; ONNX Runtime's longest chain a moment later
    gate, log = Gate(2, host=None), []
    release = {name: threading.Event() for name in ("ov busy", "ov 1", "ov 2", "ov 3", "ort 1")}
    threads = {}

    def start(name: str, group: str) -> None:
        threads[name] = hold_in_thread(lambda: gate.shared(group), log, name, release[name])
        time.sleep(WAIT_S)

    def inside() -> set[str]:
        state = {entry.rpartition(" ")[0]: entry.endswith(" in") for entry in log}
        return {name for name, held in state.items() if held}

    start("ov busy", "ov")
    start("ov 1", "ov")  # the second worker
    for name, group in (("ov 2", "ov"), ("ov 3", "ov"), ("ort 1", "ort")):
        start(name, group)
    assert inside() == {"ov busy", "ov 1"}
    release["ov busy"].set()
    time.sleep(WAIT_S)
    assert inside() == {"ov 1", "ort 1"}  # not ov 2, which asked before it: ort has nothing running
    release["ov 1"].set()
    time.sleep(WAIT_S)
    assert inside() == {"ort 1", "ov 2"}  # within a target, first come, first served
    for event in release.values():
        event.set()
    for thread in threads.values():
        thread.join(5)
    assert inside() == set()
