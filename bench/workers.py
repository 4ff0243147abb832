"""Throughput of pass-heavy work on 1, 2 and 4 local Ray workers (or local pooled workers).

    python bench/workers.py [--workers 1 2 4] [--rounds 1] [--layers 24] [--executor ray|local]

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
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--layers", type=int, default=24, help="MatMul layers of the model (768 wide)")
    parser.add_argument("--executor", choices=("ray", "local"), default="ray")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workflow", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(one_run(args.workflow, args.store, args.child, args.executor)))
        return
    cores = os.cpu_count() or 1
    print("$ python bench/workers.py " + shlex.join(sys.argv[1:]))
    print(f"host: {cores} CPU cores; the goal (>= 0.8·N x one worker's jobs/s) can only be met for N <= {cores} here")
    with tempfile.TemporaryDirectory(prefix="kiln-workers-wf-") as folder:
        workflow = write_workflow(Path(folder), args.layers)
        how = (
            "engine run WF --executor ray (a local cluster of N CPUs, no --workers)"
            if args.executor == "ray"
            else "engine run WF --workers N"
        )
        print(f"work: ort_quantize x 16 configs of a {args.layers}-layer {HIDDEN}-wide MatMul model + 17 size evaluations; each N: {how}")
        runs: dict[int, list[dict[str, Any]]] = {n: [] for n in args.workers}
        for round_ in range(args.rounds):
            shift = round_ % len(args.workers)
            for workers in args.workers[shift:] + args.workers[:shift]:
                run = measure(workflow, workers, args.executor)
                runs[workers].append(run)
                jobs = run["passes"] + run["evals"]
                print(
                    f"round {round_ + 1}: N={workers} (jobs at once: {run['gate']}): {run['passes']} passes + {run['evals']} evaluations "
                    f"in {run['wall_s']:.1f} s = {jobs / run['wall_s']:.3f} jobs/s (cluster start {run['cluster_s']:.1f} s; "
                    f"{run['in_jobs_s']:.1f} s inside the jobs' own code; load average {run['load']:.1f})",
                    flush=True,
                )
    _summary(runs, cores)


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


if __name__ == "__main__":
    main()
