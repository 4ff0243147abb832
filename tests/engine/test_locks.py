"""One builder per job key across runs sharing a store."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from engine.search.trials import owner
from engine.store.locks import job_lock


def test_a_key_held_by_a_live_run_is_waited_for(tmp_path):
    order = []
    with job_lock(tmp_path, "k" * 64, 60) as waited:
        assert waited is False

        def second():
            with job_lock(tmp_path, "k" * 64, 60) as waited_here:
                order.append(("second", waited_here))

        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.6)
        order.append(("first done", None))
    thread.join(5)
    assert order == [("first done", None), ("second", True)]
    assert list(tmp_path.iterdir()) == []


def test_a_lock_left_by_a_dead_run_is_broken(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f"{'k' * 64}.lock").write_text(json.dumps({"owner": {**owner(), "pid": dead.pid}, "until": None}))
    started = time.perf_counter()
    with job_lock(tmp_path, "k" * 64, 60):
        pass
    assert time.perf_counter() - started < 2


def test_a_lock_past_its_time_is_broken(tmp_path):
    (tmp_path / f"{'k' * 64}.lock").write_text(json.dumps({"owner": {**owner(), "host": "elsewhere"}, "until": time.time() - 1}))
    with job_lock(tmp_path, "k" * 64, 60):
        pass


def _holder(folder, key: str) -> subprocess.Popen[str]:
    code = (
        "import sys, time; from pathlib import Path; from engine.store.locks import job_lock\n"
        f"with job_lock(Path({str(folder)!r}), {key!r}, 600):\n"
        "    print('held', flush=True); time.sleep(600)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


def test_a_lock_whose_holder_was_sigkilled_is_taken_over_and_its_file_removed(tmp_path):
    key = "d" * 64
    holder = _holder(tmp_path, key)
    assert (tmp_path / f"{key}.lock").is_file()
    holder.kill()  # SIGKILL: no cleanup runs in the holder
    holder.wait()
    assert (tmp_path / f"{key}.lock").is_file()
    started = time.perf_counter()
    with job_lock(tmp_path, key, 60) as waited:
        assert waited is False
        held = json.loads((tmp_path / f"{key}.lock").read_text())
        assert held["owner"]["pid"] == owner()["pid"]
    assert time.perf_counter() - started < 2
    assert list(tmp_path.iterdir()) == []


def test_a_living_holder_is_waited_for_whatever_its_file_says(tmp_path):
    key = "e" * 64
    holder = _holder(tmp_path, key)
    (tmp_path / f"{key}.lock").write_text("")  # as if its owner were not written yet
    result: list[bool] = []

    def take() -> None:
        with job_lock(tmp_path, key, 60) as waited:
            result.append(waited)

    thread = threading.Thread(target=take)
    thread.start()
    time.sleep(1.0)
    assert result == []  # still waiting: the holder lives
    holder.kill()
    holder.wait()
    thread.join(10)
    assert result == [True]
    assert list(tmp_path.iterdir()) == []


def test_a_lock_file_left_empty_by_a_killed_run_is_taken_at_once(tmp_path):
    (tmp_path / f"{'f' * 64}.lock").write_text("")  # killed between creating the file and writing its owner
    started = time.perf_counter()
    with job_lock(tmp_path, "f" * 64, 60):
        pass
    assert time.perf_counter() - started < 2
    assert list(tmp_path.iterdir()) == []
