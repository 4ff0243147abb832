"""The worker: runs one job (a pass, an evaluation or a dataset) in its own process.

``python -m engine.execute.worker JOB.json`` reads the job, runs it, publishes its output into the store
and writes the result file — all atomically, so a worker that outlives a killed engine still
leaves a valid cache entry. A crash of the runtime kills only this process; the engine reads the
missing result file as a failure of this job.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engine import registry
from engine.core.artifact import ModelArtifact
from engine.core.errors import KilnError
from engine.plan.jobs import TargetRef, WorkOrder
from engine.store.store import Store, write_json_atomic

log = logging.getLogger("kiln.worker")


def _target(job: WorkOrder, ref: TargetRef | None = None) -> Any:
    """The order's target (or ``ref``, another target of the order), built in this process."""
    ref = ref or job.target
    if ref is None:
        return None
    cls = registry.load("targets", ref.runtime)
    target = cls(cls.Config(**ref.config))
    # where the target keeps what it compiles (TensorRT engines, ...), beside the store's objects
    target.cache_dir = Path(job.store) / "targetcache" / ref.runtime if job.store else None
    return target


def onnx_signature(model: ModelArtifact) -> list[Any] | None:
    """The inputs an ONNX model's graph declares (names, dtypes, shapes), read from the file
    without a runtime: what synthetic data is shaped after for a pass that runs on no target
    (static calibration). None for another format."""
    if model.format != "onnx":
        return None
    import onnx  # only a pass given synthetic data pays for it

    from engine.core.target import TensorSpec

    graph = onnx.load(str(model.model_file), load_external_data=False).graph
    weights = {init.name for init in graph.initializer}
    specs = []
    for value in graph.input:
        if value.name in weights:
            continue
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
        specs.append(TensorSpec(value.name, onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name, tuple(dims)))
    return specs


def _dataset_loaders(job: WorkOrder, input_model: ModelArtifact | None, signature_of: Any) -> dict[str, Any]:
    from engine.core.data import Dataset  # numpy: only workers that touch data pay for it

    loaders = {}
    for name, spec in job.datasets.items():
        if spec.path is not None:
            loaders[name] = lambda signature=None, path=spec.path: Dataset.load(Path(path))
        else:
            cls = registry.load("datasources", spec.source)
            source = cls(cls.Config(**(spec.config or {})))
            loaders[name] = lambda signature=None, source=source: source.load(input_model, signature or signature_of()).apply_split(
                source.config.split
            )
    return loaders


def _measure(job: WorkOrder, target: Any, reference: ModelArtifact, datasets: dict[str, Any], workdir: Path, cache_root: Path) -> Any:
    """``ctx.measure`` for passes that validate their own work with the workflow's evaluators;
    the pass's input model is the reference (a quantizer is judged against what it was given)."""
    from engine.core.evaluator import EvalContext

    def measure(evaluation: str, model: ModelArtifact) -> Any:
        spec = job.evaluations.get(evaluation)
        if spec is None:
            raise KilnError(f"step '{job.step_id}' asked for evaluation '{evaluation}', which its config does not name")
        if target is None:
            raise KilnError(f"step '{job.step_id}' measures models, so it needs a target")
        cls = registry.load("evaluators", spec.plugin)
        ctx = EvalContext(
            target=_opened_for(cls, target), workdir=workdir, reference=reference, datasets=datasets, cache_dir=cache_root / spec.plugin
        )
        return cls(cls.Config(**spec.config)).evaluate(model, ctx)

    return measure


def _opened_for(cls: Any, target: Any) -> Any:
    """``target`` as ``cls``'s evaluation opens it: as written for a timing evaluator or one whose
    figures describe the deployed session (``Evaluator.deployed_sessions``), else its untimed twin,
    which shares the cores with other jobs (``Target.untimed``)."""
    return target if cls.timing or cls.deployed_sessions else target.untimed()


def _staging(job: WorkOrder) -> Path:
    assert job.staging is not None, "the executor places every job"
    return Path(job.staging)


def run_pass(job: WorkOrder, store: Store) -> dict[str, Any]:
    from engine.core.passes import PassContext

    cls = registry.load("passes", job.plugin)
    model = job.model
    assert model is not None
    staging = _staging(job)
    workdir, output_dir = staging / "work", staging / "out"
    workdir.mkdir(parents=True, exist_ok=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    target = _target(job)
    input_model = job.input_model

    def signature() -> Any:
        if target is None:
            declared = onnx_signature(model)
            if declared is None:
                raise KilnError("synthetic data needs a model signature; give the step a target or use a file dataset")
            return declared
        return target.open_session(model).inputs

    datasets = _dataset_loaders(job, input_model, signature)
    ctx = PassContext(
        step_id=job.step_id or "",
        workdir=workdir,
        output_dir=output_dir,
        target=target,
        input_model=input_model,
        datasets=datasets,
        cache_dir=store.root / "passcache" / cls.name,
        measure=_measure(job, target, model, datasets, workdir, store.root / "evalcache") if job.evaluations else None,
    )
    ctx.cache_dir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)  # tools drop temporary files in the working directory
    started = time.perf_counter()
    result = cls(cls.Config(**job.config))(model, ctx)
    duration = time.perf_counter() - started
    os.chdir(staging.parent)
    digest = store.publish(output_dir, result.model.format)
    record = {
        "kind": "pass",
        "key_doc": job.key_doc,
        "digest": digest,
        "format": result.model.format,
        "attrs": result.model.attrs,
        "details": result.details,
        "notes": result.notes,
        "duration_s": round(duration, 3),
    }
    store.record(job.key, record)
    return record


def run_eval(job: WorkOrder, store: Store) -> dict[str, Any]:
    from engine.core.evaluator import EvalContext

    cls = registry.load("evaluators", job.plugin)
    model = job.model
    assert model is not None
    reference = job.reference
    target = _target(job)
    input_model = job.input_model
    workdir = _staging(job)
    os.chdir(workdir)

    def signature() -> Any:
        from engine.core.target import GenerativeSession

        session = target.open_session(reference or model)
        return session.token_inputs if isinstance(session, GenerativeSession) else session.inputs

    ctx = EvalContext(
        target=_opened_for(cls, target),
        reference_target=_opened_for(cls, _target(job, job.reference_target)) if job.reference_target is not None else None,
        workdir=workdir,
        reference=reference,
        datasets=_dataset_loaders(job, input_model, signature),
        cache_dir=store.root / "evalcache" / cls.name,
    )
    started = time.perf_counter()
    result = cls(cls.Config(**job.config)).evaluate(model, ctx)
    record = {
        "kind": "eval",
        "key_doc": job.key_doc,
        "values": result.values,
        "details": result.details,
        "samples": {name: sample.to_json() for name, sample in result.samples.items()},
        "duration_s": round(time.perf_counter() - started, 3),
    }
    store.record(job.key, record)
    return record


def run_dataset(job: WorkOrder, store: Store) -> dict[str, Any]:
    cls = registry.load("datasources", job.plugin)
    staging = _staging(job)
    out = staging / "out"
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(staging)
    config = cls.Config(**job.config)
    dataset = cls(config).load(job.input_model).apply_split(config.split)
    dataset.save(out / "dataset.npz")
    digest = store.publish(out, "dataset")
    record = {
        "kind": "dataset",
        "key_doc": job.key_doc,
        "digest": digest,
        "samples": len(dataset),
        "inputs": {k: list(v.shape) for k, v in dataset.inputs.items()},
    }
    store.record(job.key, record)
    return record


RUNNERS = {"pass": run_pass, "eval": run_eval, "dataset": run_dataset}
PR_SET_PDEATHSIG = 1


def _die(why: str) -> None:
    """End this worker and whatever it started (it leads its own process group)."""
    log.error("%s; stopping", why)
    logging.shutdown()
    if os.getpgid(0) == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(124)


#: the running job's deadline (time.time()), watched by the watchdog thread; a serving worker sets it per job
_deadline: list[float | None] = [None]


def _watch(parent: int | None, deadline: float | None, pdeathsig: bool = True) -> None:
    """The worker's own guard: it dies with the engine that started it (PR_SET_PDEATHSIG on
    Linux, and a thread polling the parent's pid everywhere) and at its own deadline, so a
    hanging runtime never outlives a killed engine or its timeout. A serving worker skips
    PR_SET_PDEATHSIG (it fires when the engine *thread* that started it ends) and relies on the
    thread."""
    _deadline[0] = deadline
    if pdeathsig and parent is not None and sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            log.warning("PR_SET_PDEATHSIG is not available; the watchdog thread alone guards this worker")
    if parent is not None and os.getppid() != parent:
        _die(f"the engine (pid {parent}) exited before this worker started")

    def loop() -> None:
        while True:
            if parent is not None and os.getppid() != parent:
                _die(f"the engine (pid {parent}) is gone")
            if _deadline[0] is not None and time.time() > _deadline[0]:
                _die("this job ran past its deadline")
            time.sleep(0.5)

    if parent is not None or deadline is not None or not pdeathsig:
        threading.Thread(target=loop, name="kiln-watchdog", daemon=True).start()


def run_job_file(job_file: Path) -> dict[str, Any]:
    """Run the job in ``job_file`` and write its result file; the outcome written."""
    job = WorkOrder.from_json(json.loads(job_file.read_text(encoding="utf-8")))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    assert job.store is not None and job.result is not None, "the executor places every job"
    store = Store(Path(job.store))
    result_path = Path(job.result)
    try:
        record = RUNNERS[job.kind](job, store)
        outcome: dict[str, Any] = {"ok": True, "record": record}
    except (KilnError, ValidationError, OSError) as error:
        log.error("%s", error)
        outcome = {"ok": False, "error": str(error), "type": type(error).__name__}
    except Exception as error:  # noqa: BLE001 - a plugin's own bug: reported with its traceback, never hidden
        traceback.print_exc()
        outcome = {
            "ok": False,
            "error": f"unexpected {type(error).__name__}: {error}",
            "type": type(error).__name__,
            "traceback": traceback.format_exc(),
        }
    write_json_atomic(result_path, outcome)
    return outcome


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    parent, deadline = os.environ.get("KILN_PARENT_PID"), os.environ.get("KILN_DEADLINE")
    if argv and argv[0] == "--serve":
        from engine.execute.serve import serve

        _watch(int(parent) if parent else None, None, pdeathsig=False)
        return serve(run_job_file, _deadline)
    _watch(int(parent) if parent else None, float(deadline) if deadline else None)
    run_job_file(Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
