"""The warm worker pool: jobs run one after another in the same process, each with its own log;
a crash or a timeout fails only its job and the worker is replaced; stopping leaves no worker."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
from engine_helpers import make_tiny_encoder

from engine import registry
from engine.core.artifact import ModelArtifact
from engine.core.hashing import sha256_json
from engine.execute.executor import LocalExecutor
from engine.execute.pool import preload_modules
from engine.plan.jobs import WorkOrder
from engine.store.store import Store


@pytest.fixture
def executor(tmp_path: Path, test_plugins: None, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(
        "KILN_PLUGINS", os.environ["KILN_PLUGINS"] + ",passes:pid=kiln_test_plugins:Pid,passes:hoard=kiln_test_plugins:Hoard"
    )
    registry._index.cache_clear()
    registry.load.cache_clear()
    executor = LocalExecutor(Store(tmp_path / "store").ensure(), pool=True)
    yield executor
    executor.close()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ModelArtifact:
    folder = tmp_path_factory.mktemp("tiny")
    make_tiny_encoder(folder / "model.onnx")
    return ModelArtifact.from_folder("onnx", folder)


def order(model: ModelArtifact, plugin: str, **config: object) -> WorkOrder:
    return WorkOrder(kind="pass", key=uuid.uuid4().hex, key_doc={}, plugin=plugin, config=dict(config), step_id=plugin, model=model)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_pooled_worker_runs_jobs_one_after_another_each_with_its_own_log(executor, model):
    first = executor.run(order(model, "pid", tag="first"))
    second = executor.run(order(model, "pid", tag="second"))
    assert first.ok and second.ok, (first.error, second.error)
    assert first.record["details"]["pid"] == second.record["details"]["pid"]
    assert second.record["details"]["left_behind"] is None  # the environment was put back
    assert first.log is not None and second.log is not None
    assert "output of first" in first.log.read_text() and "second" not in first.log.read_text()
    assert "output of second" in second.log.read_text() and "first" not in second.log.read_text()


def test_a_worker_a_job_left_a_gigabyte_larger_is_not_reused(executor, model):
    # a large model's job leaves memory in the worker (here kept alive on purpose, as an allocator's
    # arenas or a library's cache would): the next job would add it to its own peak
    small = executor.run(order(model, "hoard", tag="small", megabytes=64))
    after_small = executor.run(order(model, "pid", tag="after small"))
    large = executor.run(order(model, "hoard", tag="large", megabytes=1200))
    after_large = executor.run(order(model, "pid", tag="after large"))
    assert small.ok and after_small.ok and large.ok and after_large.ok
    assert after_small.record["details"]["pid"] == small.record["details"]["pid"]  # 64 MB left: reused
    assert after_large.record["details"]["pid"] != large.record["details"]["pid"]  # 1.2 GB left: ended
    assert gone(large.record["details"]["pid"])


def test_a_crash_fails_only_its_job_and_a_fresh_worker_runs_the_next(executor, model):
    before = executor.run(order(model, "pid", tag="before"))
    crashed = executor.run(order(model, "crash"))
    after = executor.run(order(model, "pid", tag="after"))
    assert not crashed.ok and crashed.error.startswith("the worker died with SIGSEGV")
    assert before.ok and after.ok
    assert after.record["details"]["pid"] != before.record["details"]["pid"]
    assert gone(before.record["details"]["pid"])


def test_a_timeout_kills_the_worker_and_replaces_it(executor, model):
    before = executor.run(order(model, "pid", tag="before"))
    slow = executor.run(order(model, "sleep", seconds=60), timeout_s=1)
    after = executor.run(order(model, "pid", tag="after"))
    assert not slow.ok and slow.error.startswith("timed out after 1 s")
    assert gone(before.record["details"]["pid"])
    assert after.ok and after.record["details"]["pid"] != before.record["details"]["pid"]


def test_stopping_and_closing_leave_no_worker_behind(executor, model):
    executor.warm(2)
    pids = [worker.pid for worker in executor.pool()._all]
    interrupted: list[BaseException] = []

    def busy() -> None:
        try:
            executor.run(order(model, "sleep", seconds=60))
        except BaseException as error:  # noqa: BLE001 - the test looks at what it was
            interrupted.append(error)

    thread = threading.Thread(target=busy)
    thread.start()
    time.sleep(0.5)
    executor.stop()
    thread.join(timeout=10)
    executor.close()
    assert interrupted and isinstance(interrupted[0], KeyboardInterrupt)
    assert len(pids) == 2 and all(gone(pid) for pid in pids)


def test_preloaded_modules_are_the_importable_ones_by_module_name():
    assert preload_modules(["onnxruntime", "onnxruntime-openvino", "no-such-library-here", "onnx"]) == ["onnxruntime", "onnx"]


def test_a_worker_killed_while_idle_is_replaced_for_the_next_job(executor, model):
    executor.warm(1)
    (worker,) = executor.pool()._all
    os.kill(worker.pid, signal.SIGKILL)
    done = executor.run(order(model, "pid", tag="next"))
    assert done.ok, done.error
    assert done.record["details"]["pid"] != worker.pid


def test_with_two_workers_datasets_are_read_alongside_passes_and_jobs_wait_for_them(tmp_path, tiny_onnx, test_plugins):
    import numpy as np
    from engine_helpers import tiny_workflow, write_workflow

    from engine.execute.hooks import Hooks
    from engine.run import run_workflow
    from engine.workflow import load_workflow

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1000, size=(6, 16), dtype=np.int64)
    np.savez(tmp_path / "rows.npz", input_ids=ids, attention_mask=np.ones_like(ids))
    workflow = tiny_workflow(tiny_onnx, search={"baselines": False})
    workflow["data"] = {
        "rows": {"source": "npz", "path": str(tmp_path / "rows.npz")},
        "calib": {"source": "npz", "path": str(tmp_path / "rows.npz"), "split": {"take": "first", "count": 3}},
    }
    workflow["steps"] = [{"id": "a", "pass": "copy", "config": {"tag": "a"}}, {"id": "b", "pass": "copy", "config": {"tag": "b"}}]
    workflow["evaluate"] = [{"id": "fidelity", "evaluator": "fidelity", "config": {"data": "rows"}}]
    workflow["select"] = {"objective": {"metric": "fidelity.cosine_mean", "goal": "max"}}

    class Seen(Hooks):
        def __init__(self) -> None:
            self.read: list[str] = []

        def dataset_done(self, name: str, status: str, samples: int | None) -> None:
            self.read.append(f"{name}:{status}:{samples}")

    seen = Seen()
    report = run_workflow(load_workflow(write_workflow(tmp_path, workflow)), Store(tmp_path / "store"), seen, workers=2)
    assert sorted(seen.read) == ["calib:ran:3", "rows:ran:6"]
    assert len(report.results) >= 2 and all(r.state == "complete" for r in report.results)
    assert all(r.metrics["fidelity.cosine_mean"] > 0.999 for r in report.results)


def test_a_job_s_additions_to_sys_path_stay_and_what_it_removed_comes_back(monkeypatch):
    """onnxruntime.transformers appends its folder to sys.path on import and imports modules from it
    later (fp16's float16 converter after an earlier job's fusion): undoing the addition broke that."""
    import sys

    from engine.execute.serve import _State

    monkeypatch.setattr(sys, "path", ["/a", "/b"])
    state = _State()
    sys.path.remove("/a")
    sys.path.append("/library/folder")
    state.restore(threads=None)
    assert sys.path == ["/a", "/b", "/library/folder"]


def slow_module(folder: Path, name: str, seconds: float, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module whose import sleeps ``seconds`` and writes when it began and ended."""
    folder.mkdir(parents=True, exist_ok=True)
    stamps = folder / f"{name}.times"
    (folder / f"{name}.py").write_text(
        f"import time\nstarted = time.time()\ntime.sleep({seconds})\nopen({str(stamps)!r}, 'w').write(f'{{started}} {{time.time()}}')\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]))
    return stamps


def test_a_worker_says_when_its_preloading_is_done_and_settling_waits_for_it(executor, model, tmp_path, monkeypatch):
    stamps = slow_module(tmp_path / "mods", "kiln_slow_a", 1.0, monkeypatch)
    executor.warm(1)
    pool = executor.pool()
    pool.preload(["kiln_slow_a"])
    (worker,) = pool._all
    assert worker.preloading
    pool.settle(30)
    assert not worker.preloading and stamps.is_file()  # imported before settle returned
    done = executor.run(order(model, "pid", tag="after"))  # the "ready" line does not confuse the next job's reply
    assert done.ok and done.record["details"]["pid"] == worker.pid


def test_a_timing_job_takes_the_preloading_worker_and_waits_for_the_others_imports(executor, model, tmp_path, monkeypatch):
    first = slow_module(tmp_path / "mods", "kiln_slow_b", 1.5, monkeypatch)
    second = slow_module(tmp_path / "mods", "kiln_slow_c", 1.5, monkeypatch)
    executor.warm(3)
    pool = executor.pool()
    quiet, loading, also_loading = list(pool._idle)
    loading.preload(["kiln_slow_b"])
    also_loading.preload(["kiln_slow_c"])
    timed = executor.run(order(model, "sleep", seconds=0.2), alone=True)
    assert timed.ok, timed.error
    started = timed.record["details"]["slept"][0]
    ended = {path.stem: float(path.read_text().split()[1]) for path in (first, second)}
    # the job ran in the last worker still preloading (its import under way finished first), and
    # the other preloading worker finished its import before the job began
    assert max(ended.values()) <= started
    assert not any(worker.preloading for worker in pool._idle)
    assert quiet in pool._idle


def test_a_job_takes_a_worker_that_has_imported_the_run_s_libraries_over_the_last_one_back(executor, model, tmp_path, monkeypatch):
    quick = slow_module(tmp_path / "mods", "kiln_slow_d", 0.1, monkeypatch)
    slow_module(tmp_path / "mods", "kiln_slow_e", 30.0, monkeypatch)
    executor.warm(2)
    pool = executor.pool()
    done, loading = list(pool._idle)  # `loading` is the last one back: taken first until now
    done.preload(["kiln_slow_d"])
    loading.preload(["kiln_slow_e"])
    deadline = time.monotonic() + 30
    while not quick.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # its "ready" line is written; nobody has read it yet: the job's acquire does
    assert done.preloading and loading.preloading
    ran = executor.run(order(model, "pid", tag="next"))
    assert ran.ok, ran.error
    assert ran.record["details"]["pid"] == done.pid  # not the worker still importing a 30 s module


def test_without_workers_given_as_many_jobs_run_as_cores_at_most_four(monkeypatch):
    from engine.execute import prestart

    for cores, expected in ((1, 1), (2, 2), (16, 4)):
        monkeypatch.setattr(prestart, "usable_cores", lambda cores=cores: cores)
        assert prestart.local_workers() == expected


def test_workers_started_before_the_workflow_is_read_are_adopted_or_ended(tmp_path):
    from engine.execute.prestart import prestarted

    store = Store(tmp_path / "store").ensure()
    with prestarted(2):
        executor = LocalExecutor(store, pool=True)
        adopted = executor.pool()
        assert len(adopted._all) == 2
    try:
        assert not adopted.closed  # the run's executor owns them now
    finally:
        executor.close()
    with prestarted(2):
        from engine.execute import prestart

        left = prestart._prestarted
        assert left is not None and len(left._all) == 2
        pids = [worker.pid for worker in left._all]
    assert left.closed and all(gone(pid) for pid in pids)


def test_dotted_modules_are_preloaded_without_importing_their_package_here():
    import subprocess
    import sys

    code = (
        "import sys; from engine.execute.pool import preload_modules; "
        "print(preload_modules(['transformers.modeling_utils', 'no_such_package.sub', 'onnx'])); print('transformers' in sys.modules)"
    )
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert printed[0] == "['transformers.modeling_utils', 'onnx']"
    assert printed[1] == "False"  # looked up by its package's spec only: nothing imported into the engine


def test_by_default_no_more_jobs_run_than_the_memory_holds_for_the_input_model(monkeypatch):
    import psutil

    from engine.execute import executor as executor_module

    class Memory:
        available = 24 * 2**30

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory())
    assert executor_module.memory_workers(90 * 2**20) >= 4  # a MiniLM: the cores decide
    assert executor_module.memory_workers(14 * 2**30) == 1  # a 7B decoder in FP16: one at a time
    assert executor_module.memory_workers(2 * 2**30) == 3
    assert executor_module.memory_workers(0) == executor_module.MAX_DEFAULT_WORKERS


def test_a_job_sent_right_after_another_is_not_kept_waiting_by_a_preload(executor, model, tmp_path, monkeypatch):
    stamps = slow_module(tmp_path / "mods", "kiln_slow_d", 2.0, monkeypatch)
    executor.warm(1)
    (worker,) = executor.pool()._all
    worker.preload(["kiln_slow_d"])  # arrives while the first job runs: imported once jobs stop coming
    first = executor.run(order(model, "sleep", seconds=0.5))
    second = executor.run(order(model, "sleep", seconds=0.1))
    assert first.ok and second.ok, (first.error, second.error)
    began = float(stamps.read_text().split()[0]) if stamps.is_file() else None
    assert len(executor.pool()._all) == 1  # both ran in it
    assert began is None or began >= second.record["details"]["slept"][0]  # the second job went first


def test_a_key_built_and_let_go_since_the_runs_first_look_is_served_not_built_again(executor, model):
    """Run B looked the key up (a miss), then waited at the gate while run A built it, published it
    and let its lock go: B then takes the lock at once, never having waited, and must still find
    A's record under it instead of building the key a second time."""
    key_doc = {"job": "let go", "nonce": uuid.uuid4().hex}  # a key the store can check against its document
    job = WorkOrder(
        kind="pass", key=sha256_json(key_doc), key_doc=key_doc, plugin="pid", config={"tag": "once"}, step_id="pid", model=model
    )
    first = executor.run(job)  # run A: built and published, its lock let go
    again = executor.run(job)  # run B, arriving late with the same key
    assert first.ok and not first.shared
    assert again.ok and again.shared and again.record is not None and first.record is not None
    assert again.record["digest"] == first.record["digest"] and again.record["details"] == first.record["details"]
