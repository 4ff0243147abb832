"""Processing candidates: datasets, pass jobs, evaluations.

The runner is incremental: a candidate is processed when the search asks for it — its jobs run
(or come from the store), then its evaluations. Jobs shared by candidates run once, even when the
candidates are processed at the same time by parallel workers.

Each job goes lookup → run → record: its key comes from the typed spec the planner made
(engine.plan.jobs), the store is asked first, a worker runs what it lacks, and the typed hooks
(engine.execute.hooks) hear of each step, the run's counts among them (``Tally``). Datasets live
in engine.execute.datasets, the evaluation policy in engine.execute.evaluation."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.artifact import ModelArtifact
from engine.core.loadable import onnx_load_problem
from engine.execute.datasets import Datasets, input_artifact
from engine.execute.evaluation import candidate_evaluations, evaluate
from engine.execute.executor import LocalExecutor
from engine.execute.gate import Gate
from engine.execute.hooks import Fanout, Hooks, Tally
from engine.execute.nodes import place_targets
from engine.execute.protocol import Executor
from engine.plan.jobs import EvalSpec, Key, PassSpec, WorkOrder, target_environment, target_ref
from engine.plan.planner import Candidate, Plan
from engine.select.results import CandidateResult, CandidateState, JobState, JobStatus, RunReport, Stats
from engine.store.store import Store
from engine.workflow.resolve import ResolvedWorkflow

Order, Started = Callable[[], WorkOrder], Callable[[], None]  # a job's work order, made when it runs; told when it starts


@dataclass
class Fetched:
    """A job's record: found in the store (``hit``), built meanwhile by another run sharing the
    store (``shared``), run here (``ran``), or ``failed`` with ``error``."""

    status: str
    record: dict[str, Any]
    error: str | None = None
    node: dict[str, Any] | None = None  # where it ran (``Outcome.node``)


class Runner:
    def __init__(
        self,
        resolved: ResolvedWorkflow,
        store: Store,
        hooks: Hooks | None = None,
        executor: Executor | None = None,
        plan: Plan | None = None,
        workers: int = 1,
        exclusive_timing: bool = True,
    ) -> None:
        self.resolved = resolved
        self.store = store.ensure()
        self.stats = Stats()
        self.hooks = Fanout(Tally(self.stats), hooks or Hooks())
        self.executor: Executor = executor if executor is not None else LocalExecutor(self.store)
        nodes = getattr(self.executor, "nodes", None)  # a target whose placement no node has is unavailable
        if callable(nodes) and any(getattr(e.instance.config, "placement", None) for e in resolved.targets.values()):
            place_targets(resolved, nodes(), getattr(self.executor, "where", "the executor's nodes"))
        self.plan = plan or Plan(resolved)
        # timing jobs run alone unless the user lets them overlap or the executor gives each job its own hardware
        self.gate = Gate(workers, exclusive_timing and self.executor.timing_holds_machine)
        self.exclusive_timing = exclusive_timing  # an executor that holds a node per timing job is told so (``alone``)
        self.input = input_artifact(resolved, self.store)
        self.datasets = Datasets(resolved, self.store, self.input)
        self.evaluations = candidate_evaluations(resolved)
        self._lock = threading.RLock()
        self._job_futures: dict[str, Future[JobState]] = {}
        self.results: dict[str, CandidateResult] = {}  # by candidate id, in processing order
        self._loadable: dict[str, str | None] = {}  # by model digest: why no runtime could load it
        self.references: dict[str, CandidateResult] = {}  # by target
        self.reference_models: dict[str, ModelArtifact] = {}  # by target: made, not measured (search.reference: false)
        self.jobs: dict[str, JobState] = {}
        self._datasets_thread: threading.Thread | None = None
        self._datasets_error: BaseException | None = None

    # -- keys (`engine plan` computes the same ones in engine.report.plan_status) ------------------------
    def job_key(self, job_id: str, input_digest: str) -> Key:
        return self.plan.spec(job_id).key(input_digest, self.datasets.keys, self.input.digest)

    def eval_key(
        self, spec: EvalSpec, model_digest: str, reference_digest: str | None, target_id: str, settings: dict[str, Any] | None = None
    ) -> Key:
        return self.plan.eval_key(spec, model_digest, reference_digest, target_id, settings, self.datasets.keys, self._file_digest)

    def _file_digest(self, path: Path) -> str:
        return self.store.cached_digest(path, "file")

    def materialize_datasets(self) -> None:
        """Read the datasets: first, one job at a time; alongside the first passes (each read
        taking a place in the gate, jobs that use a dataset waiting for it) when more may run."""
        if self.gate.workers == 1:
            self.datasets.materialize(self.executor, self.hooks)
            return

        def read() -> None:
            try:
                self.datasets.materialize(self.executor, self.hooks, self.gate)
            except BaseException as error:  # noqa: BLE001 - raised again by datasets_done
                self._datasets_error = error

        self._datasets_thread = threading.Thread(target=read, name="kiln-datasets", daemon=True)
        self._datasets_thread.start()

    def datasets_done(self) -> None:
        """Wait for the datasets read alongside the passes; raise what stopped them, if anything."""
        if self._datasets_thread is not None:
            self._datasets_thread.join()
        if self._datasets_error is not None:
            raise self._datasets_error

    # -- lookup → run → record ------------------------------------------------------------------
    def _fetch(self, key: str, order: Order, timeout_s: float | None, exclusive: bool, started: Started, target: str | None) -> Fetched:
        """The record of ``key``: from the store, or by running ``order()`` in a worker, its turn in
        the gate taken with the other targets' jobs (``target``: whose candidate asks)."""
        record = self.store.lookup(key)
        if record is not None:
            return Fetched("hit", record)
        with self.gate.exclusive() if exclusive else self.gate.shared(target):
            started()
            outcome = self.executor.run(order(), timeout_s=timeout_s, alone=exclusive and self.exclusive_timing)
        node = getattr(outcome, "node", None)
        if not outcome.ok:
            return Fetched("failed", {}, outcome.error, node)
        return Fetched("shared" if outcome.shared else "ran", outcome.record or {}, node=node)

    # -- passes -------------------------------------------------------------------------------
    def ensure_job(self, job_id: str, candidate: str | None = None) -> JobState:
        """The job's state once it is done: from the store, by running it, or by waiting for the
        thread that is already running it."""
        with self._lock:
            future = self._job_futures.get(job_id)
            owner = future is None
            if owner:
                future = Future()
                self._job_futures[job_id] = future
                self.jobs[job_id] = JobState(job_id, candidate=candidate)
        assert future is not None
        if not owner:
            return future.result()
        try:
            state = self._run_job(job_id)
        except BaseException as error:
            future.set_exception(error)
            raise
        future.set_result(state)
        return state

    def _run_job(self, job_id: str) -> JobState:
        spec, state = self.plan.spec(job_id), self.jobs[job_id]
        parent = self.input if spec.parent is None else self.ensure_job(spec.parent, state.candidate).artifact
        if parent is None:
            state.status = JobStatus.SKIPPED
            state.error = f"its input, {self.plan.jobs[spec.parent].label if spec.parent else 'the input'}, failed"
            return state
        unreadable = self.datasets.unreadable(spec.datasets)
        if unreadable:
            state.status, state.error = JobStatus.FAILED, unreadable
            return state
        key = spec.key(parent.digest, self.datasets.keys, self.input.digest)
        state.key = key[0]
        self.store.remember(self.plan.slot(job_id), *key)
        asking = self.results.get(state.candidate or "")  # the candidate whose target takes the turn (None: a reference made)
        order, started = (lambda: self._pass_order(spec, key, parent)), (lambda: self.hooks.job_started(spec))
        fetched = self._fetch(state.key, order, spec.timeout_s, False, started, asking.candidate.target if asking else None)
        state.node = fetched.node
        if fetched.node is not None:
            self.hooks.job_placed(spec, fetched.node)
        if fetched.status == "failed":
            state.status, state.error = JobStatus.FAILED, fetched.error
            self.hooks.job_failed(spec, fetched.error)
            return state
        state.status = JobStatus.RAN if fetched.status == "ran" else JobStatus.HIT
        if fetched.status == "hit":
            self.hooks.job_cached(spec)
        else:
            self.hooks.job_done(spec, state.status, fetched.record.get("duration_s"))
        record = state.record = fetched.record
        state.artifact = ModelArtifact(
            format=record["format"], path=self.store.object_path(record["digest"]), digest=record["digest"], attrs=record.get("attrs") or {}
        )
        return state

    def _pass_order(self, spec: PassSpec, key: Key, parent: ModelArtifact) -> WorkOrder:
        key_id, key_doc = key
        return WorkOrder(
            kind="pass",
            key=key_id,
            key_doc=key_doc,
            plugin=spec.pass_name,
            config=spec.config,
            step_id=spec.step_id,
            model=parent,
            input_model=self.input,
            target=spec.target,
            datasets=self.datasets.inputs(spec.datasets),
            evaluations=spec.evaluations,
            python=spec.python,
            environment=spec.runs_in,
        )

    # -- candidates -----------------------------------------------------------------------------
    def process(self, candidate: Candidate) -> CandidateResult:
        """Build and measure one candidate (once per run: a repeated candidate returns its result)."""
        with self._lock:
            known = self.results.get(candidate.id)
            if known is not None:
                return known
            result = CandidateResult(candidate=candidate, label=self.plan.label(candidate))
            self.results[candidate.id] = result
        model, failed = self._build(candidate)
        if failed is not None:
            result.state, result.reason = self._why_not_built(candidate, failed)
            self.hooks.candidate_done(result, measured=False)
            return result
        why = self._unloadable(model)
        if why is not None:  # never measured, so never chosen, whatever the objective (size needs no session)
            result.state, result.reason = CandidateState.FAILED, f"no target session could open its model: {why}"
            self.hooks.candidate_done(result, measured=False)
            return result
        result.model = model
        if candidate.reference:
            self.references[candidate.target] = result
        reference = self.references.get(candidate.target)
        evaluate(
            self.resolved,
            self.evaluations,
            result,
            reference,
            self.datasets,
            lambda spec, against: self._measure(spec, result, against),
            self.reference_models.get(candidate.target),
        )
        self.hooks.candidate_done(result, measured=True)
        return result

    def make_reference(self, candidate: Candidate) -> None:
        """The reference's model made (its jobs run, or from the store) but not measured (``search.reference:
        false``), for the evaluations that compare candidates with it (latency's paired timing, fidelity); nothing
        is made when none does. A job that fails leaves it unmade: those evaluations fail, saying so."""
        if not any(spec.needs_reference for spec in self.evaluations):
            return
        model, failed = self._build(candidate)
        if failed is None:
            self.reference_models[candidate.target] = model

    def _build(self, candidate: Candidate) -> tuple[ModelArtifact, str | None]:
        """``candidate``'s jobs run (or served by the store) in order: its model, and the first
        job that failed or was skipped (None when every one was built)."""
        model = self.input
        for index, job_id in enumerate(candidate.jobs):
            state = self.ensure_job(job_id, candidate.id)
            if state.status in ("failed", "skipped"):
                for later in candidate.jobs[index + 1 :]:
                    self.ensure_job(later, candidate.id)  # each ends "skipped": its input failed
                return model, job_id
            model = state.artifact or model
        return model, None

    def _unloadable(self, model: ModelArtifact | None) -> str | None:
        """Why no runtime could load ``model`` (engine.core.loadable: the ONNX checker on its path,
        its external data files, its ops' domains), checked once per stored model; None when it
        can be loaded or is not ONNX (a ``genai`` folder's model.onnx is)."""
        if model is None or model.format not in ("onnx", "genai"):
            return None
        with self._lock:
            if model.digest in self._loadable:
                return self._loadable[model.digest]
        why = onnx_load_problem(model.model_file)  # outside the lock: it reads the whole graph
        with self._lock:
            self._loadable[model.digest] = why
        return why

    def _why_not_built(self, candidate: Candidate, job_id: str) -> tuple[CandidateState, str]:
        """A candidate whose job failed: ``failed`` where it ran the failing job, else ``pruned``."""
        while self.jobs[job_id].status == "skipped":  # its input failed: look at that one
            parent = self.plan.jobs[job_id].parent
            assert parent is not None
            job_id = parent
        failed, label = self.jobs[job_id], self.plan.jobs[job_id].label
        if failed.candidate == candidate.id:
            return CandidateState.FAILED, f"step {label} failed: {failed.error}"
        return CandidateState.PRUNED, f"shares step {label}, which failed in candidate {failed.candidate}: {_first_line(failed.error)}"

    def _measure(
        self, spec: EvalSpec, result: CandidateResult, reference: ModelArtifact | None
    ) -> tuple[dict[str, Any] | None, str | None]:
        """One evaluation of a candidate's model: its record, or None and why it failed."""
        model, target, candidate = result.model, result.candidate.target, result.candidate.id
        settings = result.candidate.settings
        assert model is not None
        against = reference.digest if reference else None
        if spec.as_written is not None:  # a stricter measurement of the same evaluation answers this one too
            written = self.eval_key(spec.as_written, model.digest, against, target, settings)[0]
            if (record := self.store.lookup(written)) is not None:
                result.eval_keys[spec.id] = written
                self.hooks.eval_cached(candidate, spec.id)
                return record, None
        key, key_doc = self.eval_key(spec, model.digest, against, target, settings)
        result.eval_keys[spec.id] = key
        if result.candidate.jobs:
            place = f"{target} {self.plan.label(result.candidate)}" if settings else target  # settings variants apart
            self.store.remember(self.plan.slot(result.candidate.jobs[-1], spec.id, place), key, key_doc)

        def order() -> WorkOrder:
            return self._eval_order(spec, key, key_doc, model, reference, target, settings)

        fetched = self._fetch(key, order, spec.timeout_s, spec.timing, lambda: self.hooks.eval_started(candidate, spec.id), target)
        if fetched.node is not None:
            result.eval_nodes[spec.id] = fetched.node
            self.hooks.eval_placed(candidate, spec.id, fetched.node)
        if fetched.status == "failed":
            self.hooks.eval_failed(candidate, spec.id, fetched.error)
            return None, fetched.error
        if fetched.status == "hit":
            self.hooks.eval_cached(candidate, spec.id)
        else:
            self.hooks.eval_done(candidate, spec.id, fetched.status, fetched.record.get("duration_s"))
        return fetched.record, None

    def measure_pair(self, spec: EvalSpec, first: CandidateResult, second: CandidateResult) -> tuple[Fetched, str]:
        """``first``'s model measured by ``spec`` with ``second``'s as its reference, both on the
        target as written (a runoff: engine.execute.runoff): the record, and its key (both models'
        digests, the target's fingerprint with the host's, the evaluation's settings)."""
        assert first.model is not None and second.model is not None
        model, reference, target = first.model, second.model, first.candidate.target
        key, key_doc = self.eval_key(spec, model.digest, reference.digest, target)
        name = f"{spec.id} (runoff against {second.candidate.id})"

        def order() -> WorkOrder:
            return self._eval_order(spec, key, key_doc, model, reference, target)

        fetched = self._fetch(key, order, spec.timeout_s, spec.timing, lambda: self.hooks.eval_started(first.candidate.id, name), target)
        if fetched.status == "failed":
            self.hooks.eval_failed(first.candidate.id, name, fetched.error)
        elif fetched.status == "hit":
            self.hooks.eval_cached(first.candidate.id, name)
        else:
            self.hooks.eval_done(first.candidate.id, name, fetched.status, fetched.record.get("duration_s"))
        return fetched, key

    def _eval_order(
        self,
        spec: EvalSpec,
        key: str,
        key_doc: dict[str, Any],
        model: ModelArtifact,
        reference: ModelArtifact | None,
        target: str,
        settings: dict[str, Any] | None = None,
    ) -> WorkOrder:
        """The work order of one evaluation of ``model`` on ``target`` (with searched session
        ``settings``, its reference then measured on the target as written)."""
        environment = target_environment(self.resolved, target)
        return WorkOrder(
            kind="eval",
            key=key,
            key_doc=key_doc,
            plugin=spec.plugin,
            config=spec.config,
            model=model,
            reference=reference,
            input_model=self.input,
            target=target_ref(self.resolved, target, settings),
            reference_target=target_ref(self.resolved, target) if settings and reference is not None else None,
            datasets=self.datasets.inputs(spec.datasets),
            python=environment.python if environment is not None else None,
            environment=environment,
        )

    def report(self, started: float) -> RunReport:
        order = {c.id: i for i, c in enumerate(self.plan.candidates)}
        results = sorted(
            self.results.values(), key=lambda r: (list(self.resolved.targets).index(r.candidate.target), order[r.candidate.id])
        )
        return RunReport(
            resolved=self.resolved,
            plan=self.plan,
            store=self.store,
            input=self.input,
            datasets=self.datasets.keys,
            jobs=self.jobs,
            results=results,
            stats=self.stats,
            wall_s=time.perf_counter() - started,
        )


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if text and text.strip() else ""
