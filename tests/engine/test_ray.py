"""The Ray executor on a local Ray cluster started by the test: same jobs, same choice."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from engine_helpers import tiny_workflow, write_workflow

from engine import registry
from engine.conformance import executor_conformance_tests
from engine.execute.ray_executor import RayExecutor
from engine.run import run_workflow
from engine.store.store import Store
from engine.workflow import load_workflow

ray = pytest.importorskip("ray")


HERE = Path(__file__).parent
PLUGINS = "passes:sleep=kiln_test_plugins:Sleep,passes:pid=kiln_test_plugins:Pid,passes:crash=kiln_test_plugins:Crash"


@pytest.fixture(scope="module")
def local_cluster():
    # the test plugins reach the cluster's workers through the environment they start with
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
        patch.setenv("KILN_PLUGINS", PLUGINS)
        patch.syspath_prepend(str(HERE))
        registry._index.cache_clear()
        registry.load.cache_clear()
        ray.init(num_cpus=2, object_store_memory=128 * 2**20, include_dashboard=False, log_to_driver=False)
        yield
        ray.shutdown()
    registry._index.cache_clear()
    registry.load.cache_clear()


# the executor conformance checks, on the cluster the module starts
globals().update(
    {
        name: pytest.mark.usefixtures("local_cluster")(test)
        for name, test in executor_conformance_tests(RayExecutor, name="ray_executor").items()
    }
)


def test_ray_executor_chooses_what_the_local_executor_chooses(tmp_path, tiny_onnx, local_cluster):
    workflow = tiny_workflow(tiny_onnx)
    workflow["targets"][0]["resources"] = {"CPU": 1}
    workflow["select"] = {"objective": {"metric": "fidelity.max_abs_error", "goal": "min"}, "constraints": []}
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    local = run_workflow(resolved, Store(tmp_path / "local"))
    store = Store(tmp_path / "ray").ensure()
    on_ray = run_workflow(resolved, store, executor=RayExecutor(store, targets=resolved), workers=2)
    assert on_ray.stats.passes_run == local.stats.passes_run == 2
    assert on_ray.stats.evals_run == local.stats.evals_run
    assert [r.label for r in on_ray.results if r.chosen] == [r.label for r in local.results if r.chosen]
    assert [r.metrics["fidelity.max_abs_error"] for r in on_ray.results] == [r.metrics["fidelity.max_abs_error"] for r in local.results]


def test_without_workers_ray_runs_as_many_jobs_at_once_as_the_cluster_has_cpus(tmp_path, tiny_onnx, local_cluster):
    workflow = tiny_workflow(tiny_onnx, search={"baselines": False})
    # two paths from the input, one sleeping pass each: the cluster (2 CPUs) runs both at once (long
    # enough that the second task's worker starts within the first's sleep beside another test's
    # load under xdist: 3 s was not, twice)
    workflow["steps"] = [
        {"id": "a", "pass": "sleep", "config": {"seconds": 10.0}},
        {"id": "b", "pass": "sleep", "config": {"seconds": 10.1}},
    ]
    workflow["evaluate"] = [{"id": "size", "evaluator": "size"}]
    workflow["select"] = {"objective": {"metric": "size.file_bytes", "goal": "min"}}
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    store = Store(tmp_path / "ray").ensure()
    executor = RayExecutor(store, targets=resolved)
    assert executor.default_workers() == 2
    report = run_workflow(resolved, store, executor=executor)
    assert report.stats.passes_run == 2
    (a_start, a_end), (b_start, b_end) = (state.record["details"]["slept"] for state in report.jobs.values())
    assert a_start < b_end and b_start < a_end  # the two sleeps overlapped


def test_ray_workers_stay_warm_between_jobs_and_a_crash_stays_in_its_worker(tmp_path, tiny_onnx, local_cluster):
    workflow = tiny_workflow(tiny_onnx, search={"baselines": False})
    chain = [{"id": f"p{i}", "pass": "pid", "config": {"tag": f"p{i}"}, **({"after": f"p{i - 1}"} if i else {})} for i in range(5)]
    workflow["steps"] = [{"id": "bad", "pass": "crash"}, *chain]
    workflow["evaluate"] = [{"id": "size", "evaluator": "size"}]
    workflow["select"] = {"objective": {"metric": "size.file_bytes", "goal": "min"}}
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    store = Store(tmp_path / "ray").ensure()
    report = run_workflow(resolved, store, executor=RayExecutor(store, targets=resolved), workers=1)
    states = {r.label: r.state for r in report.results if not r.candidate.reference}
    assert states["bad"] == "failed" and states[" → ".join(f"p{i}" for i in range(5))] == "complete"
    pids = [state.record["details"]["pid"] for state in report.jobs.values() if state.record and "pid" in state.record["details"]]
    assert len(pids) == 5
    assert len(set(pids)) <= 2  # five jobs, at most one warm worker per Ray worker (2 CPUs): not a process each
