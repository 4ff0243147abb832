"""Isolated environments on a Ray cluster whose nodes keep their environments apart: a target in
an environment, pinned to the node whose folder lacks it, runs there once that node has built the
environment in its own folder, keyed as the driver's; the records say which node built it, and a
second run builds nothing.

The cluster stands for two hosts, each with its own environments folder: node_b's raylet (and so
every Ray worker and job on it) is started with its own ``KILN_ENVS_DIR``
(``Cluster.add_node(env_vars=...)``, as ``KILN_ENVS_DIR=... ray start`` on a second host would),
while the driver and node_a share the driver's. On one machine node_b would still see the
driver's folder, which a second host would not: so the test moves the driver's environment aside
once the driver has checked its target in it (``engine.run.prepare``), and back after the run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import tiny_workflow, write_workflow
from ray_cluster_helpers import two_node_cluster

from engine.core.config import EnvironmentSpec
from engine.execute.environments import MARKER
from engine.execute.hooks import EventLog
from engine.execute.ray_executor import RayExecutor
from engine.report.emit import write_outputs
from engine.run import run_workflow
from engine.store.store import Store
from engine.workflow import load_workflow

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

pytestmark = pytest.mark.slow
SIX = EnvironmentSpec(requirements=["six==1.16.0"])  # pure Python, not in the main environment


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The driver's (and node_a's) environments folder, and node_b's own."""
    root = tmp_path_factory.mktemp("ray-envs")
    return {"driver": root / "driver", "node_b": root / "node_b"}


@pytest.fixture(scope="module")
def cluster(folders: dict[str, Path]) -> Iterator[Any]:
    # the driver's folder, which the head node inherits; node_b's own through its raylet's environment
    with two_node_cluster(env={"KILN_ENVS_DIR": str(folders["driver"])}, node_b_env={"KILN_ENVS_DIR": str(folders["node_b"])}) as two:
        yield two


def _workflow(tiny_onnx: Path) -> dict[str, Any]:
    workflow = tiny_workflow(tiny_onnx, search={"baselines": False})
    target = {"id": "on_b", "runtime": "onnxruntime", "intra_op_threads": 1, "environment": {"requirements": SIX.requirements}}
    workflow["targets"] = [{**target, "placement": {"resources": {"node_b": 1}}}]
    workflow["steps"] = [{"id": "a", "pass": "sleep", "config": {"seconds": 0.1}}]
    workflow["evaluate"] = [{"id": "size", "evaluator": "size"}, {"id": "fidelity", "evaluator": "fidelity", "config": {"data": "rows"}}]
    workflow["select"] = {"objective": {"metric": "size.file_bytes", "goal": "min"}}
    return workflow


def _run_hidden(folder: Path, tiny_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[dict[str, Any]]]:
    """One run on a fresh store, the driver's environments out of node_b's sight while its jobs run."""
    import engine.run
    from engine.execute.environments import prepare as real

    hidden: list[Path] = []

    def prepare(resolved: Any, store_root: Path, build: bool, hooks: Any = None) -> list[str]:
        notes = real(resolved, store_root, build, hooks)
        for built in resolved.environments.values():
            env = Path(built.python).parent.parent
            env.rename(env.with_name(f".away-{env.name}"))
            hidden.append(env)
        return notes

    monkeypatch.setattr(engine.run, "prepare", prepare)
    resolved = load_workflow(write_workflow(folder, _workflow(tiny_onnx)))
    store = Store(folder / "store").ensure()
    try:
        with EventLog(folder / "out" / "events.jsonl") as events:
            report = run_workflow(resolved, store, events, executor=RayExecutor(store, targets=resolved), workers=2)
    finally:
        for env in hidden:
            env.with_name(f".away-{env.name}").rename(env)
    write_outputs(report, folder / "out")
    return report, [json.loads(line) for line in (folder / "out" / "events.jsonl").read_text().splitlines()]


def test_a_node_builds_the_environment_it_lacks_in_its_own_folder_once(tmp_path, tiny_onnx, cluster, folders, monkeypatch):
    key = SIX.key()
    report, events = _run_hidden(tmp_path / "first", tiny_onnx, monkeypatch)
    assert set(report.chosen()) == {"on_b"}
    assert [e["environment"] for e in events if e["event"] == "environment_started"] == [key]  # the driver's build
    evaluated = [e["node"] for e in events if e["event"] == "eval_node"]
    assert evaluated and {n["label"] for n in evaluated} == {"node_b"}
    assert {n["env"]["key"] for n in evaluated} == {key}
    assert [n["env"]["built"] for n in evaluated].count(True) == 1  # the first job built it, the others found it
    assert all(n["env"]["python"].startswith(str(folders["node_b"] / key)) for n in evaluated)
    assert all("env" not in e["node"] for e in events if e["event"] == "job_node")  # the pass runs in the engine's own
    node_marker = json.loads((folders["node_b"] / key / MARKER).read_text())
    driver_marker = json.loads((folders["driver"] / key / MARKER).read_text())
    assert node_marker["key"] == driver_marker["key"] == key and node_marker["freeze"] == driver_marker["freeze"]
    candidates = json.loads((tmp_path / "first" / "out" / "candidates.json").read_text())["candidates"]
    assert any(e["node"]["env"]["built"] for c in candidates for e in c["evaluations"].values() if "node" in e)
    # a second run (a fresh store, so its jobs run again) builds nothing, on the driver or the node
    built_at = node_marker["built_at"]
    report, events = _run_hidden(tmp_path / "second", tiny_onnx, monkeypatch)
    assert set(report.chosen()) == {"on_b"}
    assert not [e for e in events if e["event"] == "environment_started"]
    evaluated = [e["node"] for e in events if e["event"] == "eval_node"]
    assert evaluated and all(n["env"] == {**n["env"], "key": key, "built": False} for n in evaluated)
    assert json.loads((folders["node_b"] / key / MARKER).read_text())["built_at"] == built_at
