"""The Ray executor on a local Ray cluster started by the test: same jobs, same choice."""

from __future__ import annotations

import pytest
from engine_helpers import tiny_workflow, write_workflow

from engine.run import run_workflow
from engine.store import Store
from engine.workflow import load_workflow

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_cluster():
    ray.init(num_cpus=2, object_store_memory=128 * 2**20, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_executor_chooses_what_the_local_executor_chooses(tmp_path, tiny_onnx, local_cluster):
    from engine.ray_executor import RayExecutor

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
