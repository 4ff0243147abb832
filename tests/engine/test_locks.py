"""One builder per job key across runs sharing a store (issue 9, item 7)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from engine.locks import job_lock
from engine.trials import owner


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
