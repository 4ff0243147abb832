"""The Ray executor on a cluster of two nodes (both on this machine, each with its own custom
resource): jobs land on both, each records its node, a timing job holds its node alone while
passes go on on the other, targets pinned to a node's resource run their evaluations there, and
a node killed mid-run costs only its running job, run again on the other node; a fleet of two
workflows on the cluster runs the jobs they share once, on both nodes, and each chooses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import tiny_workflow, write_workflow
from ray_cluster_helpers import SMALL, two_node_cluster

from engine.execute.hooks import EventLog
from engine.execute.ray_executor import RayExecutor
from engine.report.emit import write_outputs
from engine.run import run_workflow
from engine.store.store import Store
from engine.store.verify import verify_store
from engine.workflow import load_workflow

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    with two_node_cluster() as two:
        yield two


def _run(tmp_path: Path, workflow: dict[str, Any], workers: int = 2) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    store = Store(tmp_path / "store").ensure()
    out = tmp_path / "out"
    with EventLog(out / "events.jsonl") as events:
        report = run_workflow(resolved, store, events, executor=RayExecutor(store, targets=resolved), workers=workers)
    write_outputs(report, out)
    lines = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return report, lines, json.loads((out / "candidates.json").read_text())


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["began"] < b["ended"] and b["began"] < a["ended"]


@pytest.mark.alone  # a timing's window on its node: another test's load on the cores stretches it
def test_jobs_land_on_both_nodes_and_timing_holds_only_its_own(tmp_path, tiny_onnx, cluster):
    workflow = tiny_workflow(tiny_onnx, search={"baselines": False})
    # a short pass and a long one: the short one's latency is measured while the long one sleeps (long enough that
    # the other node's worker starts and measures within it on a loaded 2-core host: 6 s was not, once in CI). The
    # short one outlasts a node's first worker starting (1.4 s here): at 0.2 s, with the long pass sent to the node
    # whose worker was still starting, the short pass and its timing were done on the warm node before the long
    # one began (1 run in 10)
    workflow["steps"] = [
        {"id": "a", "pass": "sleep", "config": {"seconds": 4.0}},
        {"id": "b", "pass": "sleep", "config": {"seconds": 20.0}},
    ]
    workflow["evaluate"] = [
        {"id": "size", "evaluator": "size"},
        {
            "id": "latency",
            "evaluator": "latency",
            "config": {"batch_size": 1, "sequence_length": 16, "warmup": 1, "runs": 5, "quiet_wait_s": 0},
        },
    ]
    workflow["select"] = {"objective": {"metric": "latency.p50_ms", "goal": "min"}}
    report, events, candidates = _run(tmp_path, workflow)
    assert report.stats.passes_run == 2
    placed = [e for e in events if e["event"] in ("job_node", "eval_node")]
    assert {e["node"]["label"] for e in placed} == {"node_a", "node_b"}  # both nodes ran jobs
    timings = [e["node"] for e in placed if e.get("evaluation") == "latency"]
    long_pass = next(e["node"] for e in placed if e.get("job") == "b")
    # a measurement ran on one node while the long pass slept on the other
    assert any(t["label"] != long_pass["label"] and _overlap(t, long_pass) for t in timings)
    for timing in timings:  # and nothing else ran beside it on its own node
        beside = [e["node"] for e in placed if e["node"] is not timing and e["node"]["id"] == timing["id"]]
        assert not any(_overlap(timing, other) for other in beside)
    # candidates.json names the node of each step and each evaluation it ran
    steps = [s for c in candidates["candidates"] for s in c["steps"]]
    assert {s["node"]["label"] for s in steps} <= {"node_a", "node_b"} and all("host" in s["node"] for s in steps)
    measured = [e["node"] for c in candidates["candidates"] for e in c["evaluations"].values() if "node" in e]  # not the store's hits
    assert measured and all(node["label"] in ("node_a", "node_b") for node in measured)


def test_a_pinned_target_evaluates_on_its_node_and_one_no_node_has_is_unavailable(tmp_path, tiny_onnx, cluster):
    workflow = tiny_workflow(tiny_onnx, search={"baselines": False})
    workflow["targets"] = [
        {"id": "on_b", "runtime": "onnxruntime", "intra_op_threads": 1, "placement": {"resources": {"node_b": 1}}},
        {"id": "h100", "runtime": "onnxruntime", "placement": {"resources": {"gpu_h100": 1}}},
    ]
    workflow["steps"] = [{"id": "a", "pass": "sleep", "config": {"seconds": 0.1}}]
    workflow["evaluate"] = [{"id": "size", "evaluator": "size"}, {"id": "fidelity", "evaluator": "fidelity", "config": {"data": "rows"}}]
    workflow["select"] = {"objective": {"metric": "size.file_bytes", "goal": "min"}}
    report, events, _ = _run(tmp_path, workflow)
    h100 = report.resolved.targets["h100"].availability
    assert not h100.ok and "gpu_h100" in h100.reason and "Ray cluster" in h100.reason
    evals = [e["node"]["label"] for e in events if e["event"] == "eval_node"]
    assert evals and set(evals) == {"node_b"}
    assert set(report.chosen()) == {"on_b"}


def test_a_node_killed_mid_run_costs_only_its_running_job(tmp_path, tiny_onnx, cluster):
    import threading
    import time

    workflow = tiny_workflow(tiny_onnx, search={"baselines": False})
    workflow["steps"] = [{"id": "a", "pass": "sleep", "config": {"seconds": 4.0}}, {"id": "b", "pass": "sleep", "config": {"seconds": 4.1}}]
    workflow["evaluate"] = [{"id": "size", "evaluator": "size"}]
    workflow["select"] = {"objective": {"metric": "size.file_bytes", "goal": "min"}}
    worker = next(node for node in cluster.worker_nodes)

    def kill() -> None:  # while both passes sleep, one on each node
        time.sleep(2.0)
        cluster.remove_node(worker, allow_graceful=False)

    killer = threading.Thread(target=kill)
    killer.start()
    try:
        report, events, _ = _run(tmp_path / "killed", workflow)
    finally:
        killer.join()
        cluster.add_node(num_cpus=1, resources={"node_b": 1}, **SMALL)
    clean = run_workflow(load_workflow(write_workflow(tmp_path / "clean", workflow)), Store(tmp_path / "clean" / "store"))
    assert report.stats.passes_run == 2 and all(r.state == "complete" for r in report.results)
    retried = [e["node"] for e in events if e["event"] == "job_node" and e["node"].get("attempts")]
    assert retried and all(n["label"] == "node_a" for n in retried)
    assert {r.label: r.model.digest for r in report.results} == {r.label: r.model.digest for r in clean.results}
    assert verify_store(Store(tmp_path / "killed" / "store")).clean  # nothing half-written


def test_a_fleet_on_the_cluster_runs_a_shared_job_once_on_both_nodes(tmp_path, tiny_onnx, cluster, capsys):
    from engine.cli.main import main

    for name in ("alpha", "beta"):  # the same two quantization jobs in each: shared by key
        workflow = tiny_workflow(tiny_onnx, name=name, search={"baselines": False})
        workflow["evaluate"] = [
            {"id": "size", "evaluator": "size"},
            {"id": "fidelity", "evaluator": "fidelity", "config": {"data": "rows"}},
        ]
        workflow["select"] = {
            "objective": {"metric": "size.file_bytes", "goal": "min"},
            "constraints": [{"metric": "fidelity.cosine_mean", "min": 0.9}],
        }
        write_workflow(tmp_path / "wf", workflow, f"{name}.yaml")
    out = tmp_path / "out"
    args = [
        "run",
        str(tmp_path / "wf"),
        "--executor",
        "ray",
        "--store",
        str(tmp_path / "store"),
        "--output",
        str(out),
        "--workers",
        "2",
        "-q",
    ]
    code = main(args)  # the fixture's cluster: ray is initialized, so the executor joins it
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "fleet: 2 of 2 workflows" in printed
    events = [json.loads(line) for name in ("alpha", "beta") for line in (out / name / "events.jsonl").read_text().splitlines()]
    passes = [e for e in events if e["event"] == "job_node"]
    assert len(passes) == 2 and len({e["job"] for e in passes}) == 2  # each shared job ran once, in one workflow
    placed = passes + [e for e in events if e["event"] == "eval_node"]
    assert {e["node"]["label"] for e in placed} == {"node_a", "node_b"}
    for name in ("alpha", "beta"):
        records = json.loads((out / name / "candidates.json").read_text())["candidates"]
        assert any(c["chosen"] for c in records)
