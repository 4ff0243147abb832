"""A target's placement: validated, out of the fingerprint, and on the local executor a target
that asks for a resource this machine lacks is unavailable, with that reason."""

from __future__ import annotations

import pytest
from engine_helpers import tiny_workflow, write_workflow

from engine.core.errors import InputError
from engine.execute.nodes import Node, NodeGate, host_resources
from engine.run import run_workflow
from engine.store.store import Store
from engine.workflow import load_workflow


def _workflow(tiny_onnx, placement):
    workflow = tiny_workflow(tiny_onnx, search={"baselines": False})
    workflow["targets"][0]["placement"] = placement
    workflow["evaluate"] = [{"id": "size", "evaluator": "size"}]
    workflow["select"] = {"objective": {"metric": "size.file_bytes", "goal": "min"}}
    return workflow


@pytest.mark.parametrize("placement", [{"resources": {}}, {"resources": {"gpu_h100": 0}}, {"resources": {"gpu_h100": 1}, "labels": ["x"]}])
def test_a_bad_placement_is_named_by_its_key_path(tmp_path, tiny_onnx, placement):
    with pytest.raises(InputError) as error:
        load_workflow(write_workflow(tmp_path, _workflow(tiny_onnx, placement)))
    assert "targets[0].placement" in str(error.value) or "placement" in str(error.value)


def test_placement_stays_out_of_the_fingerprint(tmp_path, tiny_onnx):
    plain = load_workflow(write_workflow(tmp_path / "a", tiny_workflow(tiny_onnx)))
    placed = load_workflow(write_workflow(tmp_path / "b", _workflow(tiny_onnx, {"resources": {"gpu_h100": 1}})))
    assert plain.targets["cpu"].instance.fingerprint() == placed.targets["cpu"].instance.fingerprint()
    assert "placement" not in plain.targets["cpu"].instance.config.to_json()


def test_locally_a_resource_this_machine_lacks_makes_the_target_unavailable(tmp_path, tiny_onnx, monkeypatch):
    monkeypatch.delenv("KILN_NODE_RESOURCES", raising=False)
    resolved = load_workflow(write_workflow(tmp_path, _workflow(tiny_onnx, {"resources": {"gpu_h100": 1}})))
    report = run_workflow(resolved, Store(tmp_path / "store"), workers=1)
    availability = resolved.targets["cpu"].availability
    assert not availability.ok and "gpu_h100" in availability.reason and "this machine" in availability.reason
    assert report.stats.passes_run == 0 and not report.chosen()


def test_a_declared_resource_makes_this_machine_hold_the_target(tmp_path, tiny_onnx, monkeypatch):
    monkeypatch.setenv("KILN_NODE_RESOURCES", '{"gpu_h100": 1}')
    resolved = load_workflow(write_workflow(tmp_path, _workflow(tiny_onnx, {"resources": {"gpu_h100": 1}})))
    report = run_workflow(resolved, Store(tmp_path / "store"), workers=1)
    assert resolved.targets["cpu"].availability.ok and set(report.chosen()) == {"cpu"}
    assert all(state.node and state.node["host"] for state in report.jobs.values() if state.status == "ran")


def test_bad_node_resources_are_bad_input(monkeypatch):
    monkeypatch.setenv("KILN_NODE_RESOURCES", "gpu_h100")
    with pytest.raises(InputError, match="KILN_NODE_RESOURCES"):
        host_resources()


def test_a_timing_job_holds_one_node_while_the_other_runs_passes():
    gate = NodeGate([Node("a", "h", {"CPU": 1, "node_a": 1}), Node("b", "h", {"CPU": 1, "node_b": 1})])
    with gate.take({}, alone=True) as timed:
        with gate.take({}) as other:  # the other node still takes a pass
            assert other.id != timed.id
    with gate.take({"node_b": 1}, alone=True) as pinned:
        assert pinned.id == "b"
