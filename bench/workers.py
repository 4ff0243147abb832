"""Throughput of pass-heavy work on 1, 2 and 4 local Ray workers (or local pooled workers).

    python bench/workers.py [--workers 1 2 4] [--rounds 1] [--layers 24] [--executor ray|local]
    python bench/workers.py --nodes 1 2 3 [--rounds 1] [--layers 24]

The work: one ONNX model (a stack of 768-wide MatMul layers, written here with numpy weights),
then ``ort_quantize`` with 16 distinct configs (mode dynamic; per_channel x reduce_range x
weight_type x preprocess), each candidate measured by size only (no timing evaluation, which
would run alone anyway). Each run starts from an empty store, so every pass and every
evaluation runs: 16 pass jobs and 17 evaluations (the reference too).

Each run is its own process: it starts a local Ray cluster with N CPUs (``ray.init(num_cpus=N)``)
and runs the workflow with ``--executor ray`` and no ``--workers``, so Kiln runs as many jobs at
once as the cluster has CPUs (the default this benchmark checks). Throughput is jobs run per
second of the run's wall time, the cluster's start excluded (it is printed beside). Rounds
rotate which N goes first. The goal is at least 0.8·N times one worker's throughput where N
cores exist; the machine's core count is printed, and N beyond it cannot reach the goal.

``--nodes``: the same work on a local Ray cluster of N nodes (``ray.cluster_utils.Cluster``, all on
this machine), each node 1 CPU and its own custom resource (``node_1``, ``node_2``, ...), so Kiln
places jobs across nodes as it does on a real cluster. Beside each N's jobs per second: how many
jobs each node ran, from the run's ``events.jsonl`` (its ``job_node`` and ``eval_node`` lines).
The nodes share this machine's cores: N one-CPU nodes can go no faster than min(N, cores) times
one node, so past the core count the figure shows placement and the cluster's own overhead, not
scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = 768

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _records import jobs_per_node, read_events, spread  # noqa: E402


def write_model(path: Path, layers: int) -> None:
    """x [batch, HIDDEN] -> (MatMul -> Relu) x layers -> y; seeded weights."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, name = [], [], "x"
    for i in range(layers):
        weight = (rng.standard_normal((HIDDEN, HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [name, f"w{i}"], [f"m{i}"], name=f"matmul{i}"))
        out = "y" if i == layers - 1 else f"r{i}"
        nodes.append(helper.make_node("Relu", [f"m{i}"], [out], name=f"relu{i}"))
        name = out
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", HIDDEN])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save_model(model, str(path))


def write_workflow(folder: Path, layers: int) -> Path:
    import yaml

    model = folder / "mlp.onnx"
    write_model(model, layers)
    workflow = {
        "version": 1,
        "name": "bench-workers",
        "input": {"format": "onnx", "path": str(model)},
        "targets": [{"id": "cpu", "runtime": "onnxruntime", "intra_op_threads": 1}],
        "steps": [
            {
                "id": "int8",
                "pass": "ort_quantize",
                "config": {"mode": "dynamic"},
                "search": {
                    "per_channel": [False, True],
                    "reduce_range": [False, True],
                    "weight_type": ["qint8", "quint8"],
                    "preprocess": [False, True],
                },
            }
        ],
        "evaluate": [{"id": "size", "evaluator": "size"}],
        "select": {"objective": {"metric": "size.file_bytes", "goal": "min"}},
        "search": {"sampler": "grid", "baselines": False},
    }
    path = folder / "workers.yaml"
    path.write_text(yaml.safe_dump(workflow, sort_keys=False))
    return path


def one_run(workflow: Path, store: Path, workers: int, executor_kind: str) -> dict[str, Any]:
    """In this process: a local cluster of ``workers`` CPUs, then the run; its figures."""
    from engine.run import run_workflow
    from engine.store.store import Store
    from engine.workflow import load_workflow

    resolved = load_workflow(workflow)
    store_ = Store(store).ensure()
    started = time.perf_counter()
    executor, count = None, workers
    if executor_kind == "ray":
        import ray

        from engine.execute.ray_executor import RayExecutor

        ray.init(num_cpus=workers, object_store_memory=128 * 2**20, include_dashboard=False, log_to_driver=False)
        executor, count = RayExecutor(store_, targets=resolved), None  # None: the cluster's CPUs
    cluster_s = time.perf_counter() - started
    started = time.perf_counter()
    report = run_workflow(resolved, store_, executor=executor, workers=count)
    wall = time.perf_counter() - started
    return {
        "workers": workers,
        "gate": executor.default_workers() if executor is not None else workers,
        "wall_s": wall,
        "cluster_s": cluster_s,
        "passes": report.stats.passes_run,
        "evals": report.stats.evals_run,
        "in_jobs_s": report.stats.pass_seconds + report.stats.eval_seconds,
        "load": os.getloadavg()[0],
    }


def cluster_run(workflow: Path, store: Path, nodes: int) -> dict[str, Any]:
    """In this process: a local Ray cluster of ``nodes`` one-CPU nodes, then the run; its figures
    and each node's job count from its events.jsonl. The cluster is shut down whatever happens."""
    import ray
    from ray.cluster_utils import Cluster

    from engine.execute.hooks import EventLog
    from engine.execute.ray_executor import RayExecutor
    from engine.run import run_workflow
    from engine.store.store import Store
    from engine.workflow import load_workflow

    resolved = load_workflow(workflow)
    store_ = Store(store).ensure()
    started = time.perf_counter()
    small = {"object_store_memory": 96 * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_1": 1}, **small})
    try:
        for n in range(2, nodes + 1):
            cluster.add_node(num_cpus=1, resources={f"node_{n}": 1}, **small)
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        cluster.wait_for_nodes()
        executor = RayExecutor(store_, targets=resolved)
        cluster_s = time.perf_counter() - started
        events_path = store.parent / "events.jsonl"
        started = time.perf_counter()
        with EventLog(events_path) as events:
            report = run_workflow(resolved, store_, events, executor=executor, workers=None)
        wall = time.perf_counter() - started
        gate = executor.default_workers()
    finally:
        ray.shutdown()
        cluster.shutdown()
    stats = report.stats
    return {
        "workers": nodes,
        "gate": gate,
        "wall_s": wall,
        "cluster_s": cluster_s,
        "passes": stats.passes_run,
        "evals": stats.evals_run,
        "in_jobs_s": stats.pass_seconds + stats.eval_seconds,
        "load": os.getloadavg()[0],
        "per_node": jobs_per_node(read_events(events_path)),
    }


def measure(workflow: Path, workers: int, executor_kind: str) -> dict[str, Any]:
    """One cold run in a fresh process (its own Ray cluster, an empty store)."""
    with tempfile.TemporaryDirectory(prefix="kiln-workers-") as tmp:
        command = [sys.executable, __file__, "--child", str(workers), "--workflow", str(workflow), "--store", f"{tmp}/store"]
        command += ["--executor", executor_kind]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"run with {workers} workers failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--nodes", type=int, nargs="+", help="instead: local Ray clusters of N one-CPU nodes")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--layers", type=int, default=24, help="MatMul layers of the model (768 wide)")
    parser.add_argument("--executor", choices=("ray", "local", "nodes"), default="ray", help=argparse.SUPPRESS)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workflow", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child = cluster_run(args.workflow, args.store, args.child) if args.executor == "nodes" else None
        print(json.dumps(child or one_run(args.workflow, args.store, args.child, args.executor)))
        return
    if args.nodes:
        args.executor, args.workers = "nodes", args.nodes
    cores = os.cpu_count() or 1
    print("$ python bench/workers.py " + shlex.join(sys.argv[1:]))
    if args.executor == "nodes":
        print(
            f"host: {cores} CPU cores shared by every node: N one-CPU nodes can reach at most min(N, {cores})x one node's jobs/s; "
            f"past N = {cores} the figure shows placement across nodes and the cluster's overhead, not scaling"
        )
    else:
        print(f"host: {cores} CPU cores; the goal (>= 0.8·N x one worker's jobs/s) can only be met for N <= {cores} here")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="kiln-workers-wf-") as folder:
        workflow = write_workflow(Path(folder), args.layers)
        print(
            f"work: ort_quantize x 16 configs of a {args.layers}-layer {HIDDEN}-wide MatMul model + their size evaluations; each N: {HOW[args.executor]}"
        )
        runs: dict[int, list[dict[str, Any]]] = {n: [] for n in args.workers}
        for round_ in range(args.rounds):
            shift = round_ % len(args.workers)
            for workers in args.workers[shift:] + args.workers[:shift]:
                run = measure(workflow, workers, args.executor)
                runs[workers].append(run)
                _print_run(round_, run)
    if args.executor == "nodes":
        _summary_nodes(runs, cores)
    else:
        _summary(runs, cores)


HOW = {
    "ray": "engine run WF --executor ray (a local cluster of N CPUs, no --workers)",
    "local": "engine run WF --workers N",
    "nodes": "engine run WF --executor ray on a local cluster of N nodes of 1 CPU each (node_1 ... node_N), no --workers",
}


def _print_run(round_: int, run: dict[str, Any]) -> None:
    jobs = run["passes"] + run["evals"]
    print(
        f"round {round_ + 1}: N={run['workers']} (jobs at once: {run['gate']}): {run['passes']} passes + {run['evals']} evaluations "
        f"in {run['wall_s']:.1f} s = {jobs / run['wall_s']:.3f} jobs/s (cluster start {run['cluster_s']:.1f} s; "
        f"{run['in_jobs_s']:.1f} s inside the jobs' own code; load average {run['load']:.1f})",
        flush=True,
    )
    if "per_node" in run:
        print(f"  jobs per node (events.jsonl): {spread(run['per_node'])}", flush=True)


def _summary(runs: dict[int, list[dict[str, Any]]], cores: int) -> None:
    rate = {n: statistics.median((r["passes"] + r["evals"]) / r["wall_s"] for r in found) for n, found in runs.items()}
    base = rate.get(1) or rate[min(rate)]
    print(f"{'N':>3} {'jobs/s':>8} {'x one worker':>13} {'goal':>6}  verdict")
    for n, value in rate.items():
        ratio = value / base
        goal = 0.8 * n
        if ratio >= goal:
            verdict = "met"
        elif n > cores:
            verdict = f"not met (only {cores} cores here: at most about {cores}x)"
        else:
            verdict = "not met"
        print(f"{n:>3} {value:>8.3f} {ratio:>12.2f}x {goal:>5.1f}x  {verdict}")


def _summary_nodes(runs: dict[int, list[dict[str, Any]]], cores: int) -> None:
    rate = {n: statistics.median((r["passes"] + r["evals"]) / r["wall_s"] for r in found) for n, found in runs.items()}
    base = rate.get(1) or rate[min(rate)]
    print(f"{'N':>3} {'jobs/s':>8} {'x one node':>11} {'ceiling':>8}  jobs per node (last round)")
    for n, value in rate.items():
        ceiling = min(n, cores)
        print(f"{n:>3} {value:>8.3f} {value / base:>10.2f}x {ceiling:>7}x  {spread(runs[n][-1]['per_node'])}")


if __name__ == "__main__":
    main()
