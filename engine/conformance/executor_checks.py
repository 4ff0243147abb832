"""The executor checks (engine.execute.protocol): real jobs (a built-in pass on the tiny ONNX
model) run by the executor a factory makes for a store, compared with the local executor's, and
``executor_conformance_tests``, which makes pytest tests of them."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from engine import registry
from engine.conformance.models import tiny_onnx_model
from engine.conformance.plugin_checks import example_config
from engine.core.artifact import ModelArtifact
from engine.core.hashing import sha256_json
from engine.execute.executor import LocalExecutor
from engine.execute.protocol import Executor, Outcome
from engine.plan.jobs import WorkOrder
from engine.store.store import Store

ExecutorFactory = Callable[[Store], Executor]
#: the pass the executor checks run: built in, fast, and deterministic on the tiny ONNX model
EXECUTOR_PASS = "fp16"
#: how long one job of the executor checks may take
JOB_TIMEOUT_S = 300.0


def pass_order(model_folder: Path, copy: int = 0) -> WorkOrder:
    """A job of ``EXECUTOR_PASS`` on the ONNX model in ``model_folder``, keyed as the runner keys
    one (``copy``: another key for the same work)."""
    cls = registry.load("passes", EXECUTOR_PASS)
    config = example_config(cls).to_json()
    model = ModelArtifact.from_folder("onnx", model_folder)
    key_doc = {
        "scheme": "kiln-conformance",
        "pass": cls.name,
        "version": cls.version,
        "config": config,
        "input": model.digest,
        "copy": copy,
    }
    return WorkOrder(
        kind="pass",
        key=sha256_json(key_doc),
        key_doc=key_doc,
        plugin=cls.name,
        config=config,
        step_id="conformance",
        model=model,
        input_model=model,
    )


@contextlib.contextmanager
def _opened(factory: ExecutorFactory, store_dir: Path) -> Iterator[tuple[Executor, Store]]:
    store = Store(store_dir).ensure()
    executor = factory(store)
    try:
        yield executor, store
    finally:
        executor.close()


def _same(record: dict[str, Any] | None) -> dict[str, Any]:
    """What two runs of one job agree on: the record but its duration, the names of its details
    (their values may be timings) and not the key the store adds."""
    same = {k: v for k, v in (record or {}).items() if k not in ("duration_s", "key", "details")}
    return {**same, "details": sorted((record or {}).get("details") or {})}


def _run(executor: Executor, job: WorkOrder) -> Outcome:
    try:
        return executor.run(job, timeout_s=JOB_TIMEOUT_S)
    except Exception as error:
        raise AssertionError(
            f"executor {type(executor).__name__} raised {error!r} for a job; a job that fails is an Outcome, ok=False"
        ) from error


def check_executor_members(factory: ExecutorFactory) -> None:
    """Every member of the protocol; ``default_workers`` None or a positive number; ``warm`` and
    ``preload`` take what the engine gives them (a library not installed among them); ``stop`` and
    ``close`` return with nothing running, and ``close`` again does nothing."""
    with tempfile.TemporaryDirectory() as scratch, _opened(factory, Path(scratch) / "store") as (executor, _):
        name = type(executor).__name__
        missing = sorted({member for member in vars(Executor) if not member.startswith("_")} - set(dir(executor)))
        assert not missing, f"executor {name} lacks {', '.join(missing)} of the Executor protocol"
        workers = executor.default_workers()
        assert workers is None or (type(workers) is int and workers > 0), (
            f"executor {name}: default_workers() is {workers!r}, not None or > 0"
        )
        assert isinstance(executor.local, bool) and isinstance(executor.timing_holds_machine, bool), f"executor {name}: flags not bools"
        executor.warm(workers or 1)
        executor.preload([*registry.load("passes", EXECUTOR_PASS).warm_modules("onnx"), "kiln-conformance-not-installed"])
        executor.stop()
        executor.close()
        executor.close()  # and once more as the check ends


def check_executor_runs_a_pass(factory: ExecutorFactory) -> None:
    """Warmed and preloaded as the engine does it, the executor runs a pass job on the tiny ONNX
    model: ``ok``, with the record the local executor returns (but the duration), filed in the
    store under the job's key."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        job = pass_order(tiny_onnx_model(root / "input").parent)
        with _opened(lambda store: LocalExecutor(store, pool=False), root / "local") as (local, _):
            expected = local.run(job, timeout_s=JOB_TIMEOUT_S)
        assert expected.ok, f"the local executor failed the check's own job (is {EXECUTOR_PASS} usable here?): {expected.error}"
        with _opened(factory, root / "store") as (executor, store):
            executor.warm(1)
            executor.preload(list(registry.load("passes", EXECUTOR_PASS).warm_modules("onnx")))
            outcome = _run(executor, job)
            filed = store.lookup(job.key)
        name = type(executor).__name__
        assert outcome.ok, f"executor {name} failed a job the local executor runs: {outcome.error}"
        assert _same(outcome.record) == _same(expected.record), f"executor {name} returned {outcome.record}, not {expected.record}"
        assert _same(filed) == _same(expected.record), f"executor {name} filed {filed} under the job's key, not {expected.record}"


def check_executor_reports_a_failure(factory: ExecutorFactory) -> None:
    """A pass job whose model is not ONNX fails in the worker: the executor returns an ``Outcome``
    that is not ``ok`` and says why, raises nothing, and files nothing under the job's key."""
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "broken"
        folder.mkdir()
        (folder / "model.onnx").write_bytes(b"not an onnx model")
        job = pass_order(folder)
        with _opened(factory, Path(scratch) / "store") as (executor, store):
            outcome = _run(executor, job)
            filed = store.lookup(job.key)
        name = type(executor).__name__
        assert not outcome.ok, f"executor {name} reported a failing job as done: {outcome.record}"
        assert outcome.error and outcome.error.strip(), f"executor {name} reported a failed job without saying why"
        assert filed is None, f"executor {name} filed a record for a job that failed: {filed}"


def check_executor_runs_jobs_at_once(factory: ExecutorFactory) -> None:
    """Two jobs sent from two threads at once, as the engine's threads send them, both succeed and
    publish the same model: ``run`` is thread-safe."""
    with tempfile.TemporaryDirectory() as scratch:
        model = tiny_onnx_model(Path(scratch) / "input").parent
        jobs = [pass_order(model, copy) for copy in (1, 2)]
        with _opened(factory, Path(scratch) / "store") as (executor, store), ThreadPoolExecutor(2) as threads:
            executor.warm(2)
            outcomes = list(threads.map(lambda job: _run(executor, job), jobs))
            filed = [store.lookup(job.key) for job in jobs]
        name = type(executor).__name__
        assert all(o.ok for o in outcomes), f"executor {name} failed jobs run at once: {[o.error for o in outcomes if not o.ok]}"
        assert all(filed), f"executor {name} filed no record for a job run beside another"
        assert len({o.record["digest"] for o in outcomes if o.record}) == 1, f"executor {name}: one job's two runs made different models"


EXECUTOR_CHECKS = {
    "members": check_executor_members,
    "runs_a_pass": check_executor_runs_a_pass,
    "reports_a_failure": check_executor_reports_a_failure,
    "runs_jobs_at_once": check_executor_runs_jobs_at_once,
}


def executor_conformance_tests(factory: ExecutorFactory, name: str = "executor") -> dict[str, Callable[[], None]]:
    """pytest test functions, ``test_<name>_<check>``, running every executor check over the
    executors ``factory`` makes (given a fresh store each time). Put the result in a test
    module's globals; ``name`` tells several executors' tests apart in one module."""

    def test_of(check: Callable[[ExecutorFactory], None]) -> Callable[[], None]:
        def test() -> None:
            check(factory)

        return test

    tests = {f"test_{name}_{what}": test_of(check) for what, check in EXECUTOR_CHECKS.items()}
    for test_name, test in tests.items():
        test.__name__ = test.__qualname__ = test_name
    return tests
