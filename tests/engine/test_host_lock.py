"""KILN_HOST_LOCK: runs that share a machine keep their timing jobs apart from each other's jobs
(engine.execute.host_lock, taken by engine.execute.gate)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from holders import hold_in_thread

from engine.core.errors import InputError
from engine.execute.gate import Gate
from engine.execute.host_lock import HOST_LOCK_ENV, HostLock
from tests.engine.engine_helpers import engine_cmd, tiny_workflow, write_workflow

WAIT_S = 0.3


def _job(gate: Gate, timing: bool, log: list[str], name: str, release: threading.Event) -> threading.Thread:
    return hold_in_thread(lambda: gate.exclusive() if timing else gate.shared(), log, name, release)


def test_two_runs_gates_on_one_host_lock_keep_a_timing_job_alone(tmp_path: Path) -> None:
    # two runs' gates (each lets 2 jobs run at once) on one machine-wide lock
    lock = HostLock(tmp_path / "host.lock")
    one, two = Gate(2, host=lock), Gate(2, host=lock)
    log: list[str] = []
    passes, timing, later = threading.Event(), threading.Event(), threading.Event()
    busy = _job(one, False, log, "pass", passes)
    time.sleep(WAIT_S)
    timed = _job(two, True, log, "timing", timing)
    time.sleep(WAIT_S)
    assert log == ["pass in"]  # the other run's timing waits for this run's pass
    queued = _job(one, False, log, "next pass", later)
    time.sleep(WAIT_S)
    assert log == ["pass in"]  # and this run's next job waits behind the waiting timing (the turnstile)
    passes.set()
    busy.join(5)
    time.sleep(WAIT_S)
    assert log == ["pass in", "pass out", "timing in"]
    timing.set()
    timed.join(5)
    later.set()
    queued.join(5)
    assert log[-2:] == ["next pass in", "next pass out"]


def test_without_the_variable_or_with_timing_left_to_others_no_lock_is_taken(monkeypatch) -> None:
    monkeypatch.delenv(HOST_LOCK_ENV, raising=False)
    assert Gate(2).host is None
    monkeypatch.setenv(HOST_LOCK_ENV, "/tmp/kiln-test-unused.lock")
    assert Gate(2, exclusive_timing=False).host is None  # a fleet's workflow: the fleet's gate holds it
    assert Gate(2).host is not None and Gate(2).host.path == Path("/tmp/kiln-test-unused.lock")  # type: ignore[union-attr]


def test_a_lock_path_that_cannot_be_opened_is_bad_input(tmp_path: Path, monkeypatch) -> None:
    given = str(tmp_path / "no-such-folder" / "host.lock")
    monkeypatch.setenv(HOST_LOCK_ENV, given)
    with pytest.raises(InputError) as raised:
        Gate(2)
    text = str(raised.value)
    assert HOST_LOCK_ENV in text and repr(given) in text and "fix:" in text


def test_a_run_starts_no_job_while_another_process_times_and_then_finishes(tmp_path: Path, tiny_onnx: Path) -> None:
    workflow = write_workflow(tmp_path / "wf", tiny_workflow(tiny_onnx))
    lock = HostLock(tmp_path / "host.lock")
    env = {**os.environ, HOST_LOCK_ENV: str(lock.path), "KILN_LOG_DIR": str(tmp_path / "logs")}
    command = [*engine_cmd(), "run", str(workflow), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out")]
    with lock.exclusive():  # another run's timing job holds the machine
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        time.sleep(6)
        assert process.poll() is None  # still waiting
        released = time.time()
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out
    assert "chosen for cpu" in out
    events = [json.loads(line) for line in (tmp_path / "out" / "events.jsonl").read_text().splitlines()]
    starts = [e["t"] for e in events if e["event"] in ("job_start", "eval_start")]
    assert starts and min(starts) >= released  # not one job or evaluation began while the lock was held
