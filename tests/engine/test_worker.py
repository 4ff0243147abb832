"""Workers guard themselves: they die with the engine that started them and at their own
deadline, so a hanging runtime never outlives a killed engine (issue 9, item 9)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
from engine_helpers import engine_cmd, tiny_workflow, write_workflow

from engine.core.hashing import digest_tree


def _sleep_job(tmp_path, tiny_onnx, seconds: float) -> tuple[dict, str]:
    staging = tmp_path / "store" / "tmp" / "pass-x"
    staging.mkdir(parents=True)
    job = {
        "kind": "pass",
        "key": "k" * 64,
        "key_doc": {},
        "plugin": "sleep",
        "config": {"seconds": seconds},
        "step_id": "slow",
        "model": {"format": "onnx", "path": str(tiny_onnx), "digest": digest_tree(tiny_onnx, "onnx"), "attrs": {}},
        "store": str(tmp_path / "store"),
        "staging": str(staging),
        "result": str(staging / "result.json"),
    }
    path = staging / "job.json"
    path.write_text(json.dumps(job))
    return job, str(path)


def test_a_worker_dies_at_its_own_deadline(tmp_path, tiny_onnx, test_plugins):
    job, job_file = _sleep_job(tmp_path, tiny_onnx, 60)
    env = {**os.environ, "KILN_DEADLINE": repr(time.time() + 2), "KILN_PARENT_PID": str(os.getpid())}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "engine.execute.worker", job_file],
        env=env,
        capture_output=True,
        text=True,
        timeout=40,
        start_new_session=True,
    )
    assert time.perf_counter() - started < 30
    assert done.returncode in (-signal.SIGKILL, 124)
    assert "ran past its deadline" in done.stderr
    assert not os.path.exists(job["result"])


def _sleeping_workers(engine: psutil.Process) -> list[psutil.Process]:
    """The engine's worker processes running the sleep pass."""
    found = []
    try:
        children = engine.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for child in children:
        try:
            cmdline = child.cmdline()
            if "engine.execute.worker" in cmdline and json.loads(open(cmdline[-1]).read())["plugin"] == "sleep":
                found.append(child)
        except (psutil.NoSuchProcess, OSError, ValueError, KeyError):
            continue
    return found


def test_a_worker_dies_with_a_killed_engine(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [{"id": "slow", "pass": "sleep", "config": {"seconds": 120}}]
    path = write_workflow(tmp_path, workflow)
    process = subprocess.Popen(
        [*engine_cmd(), "run", str(path), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    engine = psutil.Process(process.pid)
    deadline = time.time() + 90
    workers: list[psutil.Process] = []
    while time.time() < deadline and not workers:
        workers = _sleeping_workers(engine)
        time.sleep(0.1)
    assert workers, "the sleep pass never started"
    time.sleep(1.0)
    process.kill()  # SIGKILL to the engine alone: its worker leads its own process group
    process.wait()
    _, alive = psutil.wait_procs(workers, timeout=10)
    for worker in alive:
        worker.kill()
    assert not alive, "a worker outlived its engine"


def test_a_workers_target_gets_a_cache_folder_in_the_store(tmp_path):
    from engine.execute.worker import _target
    from engine.plan.jobs import TargetRef, WorkOrder

    ref = TargetRef(runtime="onnxruntime", config={"id": "cpu", "runtime": "onnxruntime"})
    job = WorkOrder(kind="eval", key="k", key_doc={}, plugin="latency", config={}, target=ref, store=str(tmp_path))
    assert _target(job).cache_dir == tmp_path / "targetcache" / "onnxruntime"
    assert _target(WorkOrder(kind="eval", key="k", key_doc={}, plugin="latency", config={}, target=ref)).cache_dir is None
