"""Processing candidates: datasets, pass jobs, evaluations.

The runner is incremental: a candidate is processed when the search asks for it — its jobs run
(or come from the store), then its evaluations. Jobs shared by candidates run once, even when the
candidates are processed at the same time by parallel workers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine import keys, registry
from engine.core.artifact import ModelArtifact
from engine.core.errors import InputError
from engine.core.hashing import sha256_json
from engine.core.refs import RefKind, referenced, references
from engine.executor import LocalExecutor, Outcome
from engine.gate import Gate
from engine.planner import Candidate, Plan
from engine.results import CandidateResult, JobState, RunReport, Stats
from engine.select import cheap_violations
from engine.store import Store
from engine.workflow.resolve import ResolvedWorkflow

EventSink = Callable[[str, dict[str, Any]], None]


def noop(kind: str, fields: dict[str, Any]) -> None:
    return None


def located(resolved: ResolvedWorkflow, where: str, compute: Callable[[], str]) -> str:
    """``compute()`` (a digest of user files), with a refused file placed in the workflow."""
    try:
        return compute()
    except InputError as error:
        problems = [replace(p, where=f"{where} ({p.where})", file=str(resolved.file)) for p in error.problems]
        raise InputError(problems) from None


def input_artifact(resolved: ResolvedWorkflow, store: Store) -> ModelArtifact:
    spec = resolved.input
    extra = {"function": spec.attrs["function"], "kwargs": spec.attrs.get("kwargs", {})} if spec.format == "torch" else None
    digest = located(resolved, "input.path", lambda: store.cached_digest(spec.path, spec.format, extra))
    return ModelArtifact(format=spec.format, path=spec.path, digest=digest, attrs=dict(spec.attrs))


def target_spec(resolved: ResolvedWorkflow, target_id: str) -> dict[str, Any]:
    entry = resolved.targets[target_id]
    return {"runtime": entry.cls.runtime, "config": entry.instance.config.to_json()}


class Runner:
    def __init__(
        self,
        resolved: ResolvedWorkflow,
        store: Store,
        on_event: EventSink = noop,
        executor: Any = None,
        plan: Plan | None = None,
        workers: int = 1,
        exclusive_timing: bool = True,
    ) -> None:
        self.resolved = resolved
        self.store = store.ensure()
        self.on_event = on_event
        self.executor = executor or LocalExecutor(self.store)
        self.stats = Stats()
        self.plan = plan or Plan(resolved)
        self.gate = Gate(workers, exclusive_timing)
        self.input = input_artifact(resolved, self.store)
        self._lock = threading.RLock()
        self._job_futures: dict[str, Future[JobState]] = {}
        self.results: dict[str, CandidateResult] = {}  # by candidate id, in processing order
        self.references: dict[str, CandidateResult] = {}  # by target
        self.dataset_keys: dict[str, str] = {}
        self.dataset_docs: dict[str, dict[str, Any]] = {}
        self.dataset_paths: dict[str, str] = {}
        self.dataset_errors: dict[str, str] = {}
        self.jobs: dict[str, JobState] = {}

    # -- keys (computable without running anything: `engine plan` uses them) ---------------------
    def compute_dataset_keys(self) -> dict[str, str]:
        for name, entry in self.resolved.datasets.items():
            file_digests = {
                option: located(self.resolved, f"data.{name}.{option}", lambda p=Path(path): self.store.cached_digest(p, "file"))
                for option, path in referenced(entry.cls.Config, entry.config, RefKind.FILE).items()
            }
            self.dataset_keys[name], self.dataset_docs[name] = keys.dataset_key(entry.cls, entry.config, file_digests, self.input.digest)
        return self.dataset_keys

    def _data_refs(self, cls: Any, config: dict[str, Any]) -> dict[str, str]:
        names = list(referenced(cls.Config, config, RefKind.DATASET).values())
        return {name: self.dataset_keys[name] for name in names}

    def _evaluations_for(self, cls: Any, config: dict[str, Any]) -> dict[str, Any]:
        """The workflow evaluations a pass measures with (its ``EvaluationRef`` options), by id."""
        ids = list(referenced(cls.Config, config, RefKind.EVALUATION).values())
        out = {}
        for eval_id in ids:
            entry = self.resolved.evaluators[eval_id]
            out[eval_id] = {"plugin": entry.name, "version": entry.cls.version, "config": entry.config}
        return out

    def _pass_data_refs(self, cls: Any, config: dict[str, Any]) -> dict[str, str]:
        refs = self._data_refs(cls, config)
        for spec in self._evaluations_for(cls, config).values():
            refs.update(self._data_refs(registry.load("evaluators", spec["plugin"]), spec["config"]))
        return refs

    def job_key(self, job_id: str, input_digest: str) -> tuple[str, dict[str, Any]]:
        job = self.plan.jobs[job_id]
        step = self.resolved.steps[job.step_id]
        target = self.resolved.targets[job.target].instance.fingerprint() if job.target else None
        data = self._pass_data_refs(step.pass_cls, job.config)
        if RefKind.INPUT_MODEL in references(step.pass_cls.Config):
            data = {**data, "workflow input": self.input.digest}
        return keys.pass_key(step.pass_cls, job.config, input_digest, data, target, self._evaluations_for(step.pass_cls, job.config))

    def eval_key(self, entry: Any, model_digest: str, reference_digest: str | None, target_id: str) -> tuple[str, dict[str, Any]]:
        """An evaluation's key: the datasets it reads by key, the files it names by content."""
        refs = self._data_refs(entry.cls, entry.config)
        paths = referenced(entry.cls.Config, entry.config, RefKind.FILE)
        files = {f"file:{o}": self.store.cached_digest(Path(path), "file") for o, path in paths.items()}
        fingerprint = self.resolved.targets[target_id].instance.fingerprint()
        return keys.eval_key(entry.cls, entry.config, model_digest, reference_digest, fingerprint, {**refs, **files})

    def slot(self, job_id: str, evaluation: str | None = None, target: str | None = None) -> str:
        """A job's place in this workflow, stable when its config changes (for --explain)."""
        chain = []
        current: str | None = job_id
        while current:
            chain.append(self.plan.jobs[current].label)
            current = self.plan.jobs[current].parent
        return sha256_json({"workflow": self.resolved.name, "chain": chain[::-1], "evaluation": evaluation, "target": target})

    def _datasets_for(self, refs: dict[str, str]) -> dict[str, Any]:
        out = {}
        for name in refs:
            entry = self.resolved.datasets[name]
            out[name] = (
                {"path": self.dataset_paths[name]} if name in self.dataset_paths else {"source": entry.cls.name, "config": entry.config}
            )
        return out

    # -- datasets -----------------------------------------------------------------------------
    def materialize_datasets(self) -> None:
        self.compute_dataset_keys()
        for name, entry in self.resolved.datasets.items():
            if entry.cls.needs_signature:
                continue  # built from the consuming model's signature, where that model is
            key = self.dataset_keys[name]
            record = self.store.lookup(key)
            if record is None:
                key_doc = self.dataset_docs[name]
                self.on_event("dataset_start", {"name": name})
                outcome = self.executor.run(
                    {
                        "kind": "dataset",
                        "key": key,
                        "key_doc": key_doc,
                        "plugin": entry.cls.name,
                        "config": entry.config,
                        "input_model": self.input.to_json(),
                    },
                    timeout_s=entry.cls.default_timeout_s,
                )
                if not outcome.ok:
                    self.dataset_errors[name] = outcome.error or "failed"
                    self.on_event("dataset_end", {"name": name, "ok": False, "error": outcome.error})
                    continue
                record = outcome.record or {}
                if outcome.shared:  # another run sharing the store read it while this one waited
                    self.stats.datasets_cached += 1
                else:
                    self.stats.datasets_run += 1
            else:
                self.stats.datasets_cached += 1
            self.dataset_paths[name] = str(self.store.object_path(record["digest"]) / "dataset.npz")
            self.on_event("dataset_end", {"name": name, "ok": True, "samples": record.get("samples")})

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
        job = self.plan.jobs[job_id]
        state = self.jobs[job_id]
        if job.parent is None:
            parent = self.input
        else:
            parent_state = self.ensure_job(job.parent, state.candidate)
            parent = parent_state.artifact
        if parent is None:
            state.status = "skipped"
            state.error = f"its input, {self.plan.jobs[job.parent].label if job.parent else 'the input'}, failed"
            return state
        step = self.resolved.steps[job.step_id]
        missing = [n for n in self._pass_data_refs(step.pass_cls, job.config) if n in self.dataset_errors]
        if missing:
            state.status, state.error = "failed", f"dataset {missing[0]} could not be read: {self.dataset_errors[missing[0]]}"
            return state
        state.key, key_doc = self.job_key(job_id, parent.digest)
        self.store.remember(self.slot(job_id), state.key, key_doc)
        record = self.store.lookup(state.key)
        if record is not None:
            state.status = "hit"
            with self._lock:
                self.stats.passes_cached += 1
            self.on_event("job_end", {"job": job.label, "status": "hit"})
        else:
            with self.gate.shared():
                self.on_event("job_start", {"job": job.label})
                outcome = self.executor.run(
                    {
                        "kind": "pass",
                        "key": state.key,
                        "key_doc": key_doc,
                        "plugin": step.pass_name,
                        "config": job.config,
                        "step_id": job.step_id,
                        "model": parent.to_json(),
                        "input_model": self.input.to_json(),
                        "target": target_spec(self.resolved, job.target) if job.target else None,
                        "datasets": self._datasets_for(self._pass_data_refs(step.pass_cls, job.config)),
                        "evaluations": self._evaluations_for(step.pass_cls, job.config),
                    },
                    timeout_s=step.timeout_s or step.pass_cls.default_timeout_s,
                )
            if not outcome.ok:
                state.status, state.error = "failed", outcome.error
                self.on_event("job_end", {"job": job.label, "status": "failed", "error": outcome.error})
                return state
            record = outcome.record or {}
            state.status = "hit" if outcome.shared else "ran"  # shared: another run built it meanwhile
            with self._lock:
                if outcome.shared:
                    self.stats.passes_cached += 1
                else:
                    self.stats.passes_run += 1
                    self.stats.pass_seconds += float(record.get("duration_s") or 0.0)
            self.on_event("job_end", {"job": job.label, "status": state.status, "seconds": record.get("duration_s")})
        state.record = record
        state.artifact = ModelArtifact(
            format=record["format"], path=self.store.object_path(record["digest"]), digest=record["digest"], attrs=record.get("attrs") or {}
        )
        return state

    # -- candidates -----------------------------------------------------------------------------
    def process(self, candidate: Candidate) -> CandidateResult:
        """Build and measure one candidate (once per run: a repeated candidate returns its result)."""
        with self._lock:
            known = self.results.get(candidate.id)
            if known is not None:
                return known
            result = CandidateResult(candidate=candidate, label=self.plan.label(candidate))
            self.results[candidate.id] = result
        model = self.input
        for index, job_id in enumerate(candidate.jobs):
            state = self.ensure_job(job_id, candidate.id)
            if state.status in ("failed", "skipped"):
                for later in candidate.jobs[index + 1 :]:
                    self.ensure_job(later, candidate.id)  # each ends "skipped": its input failed
                failing = self._first_failure(job_id)
                failed_state = self.jobs[failing]
                label = self.plan.jobs[failing].label
                if failed_state.candidate == candidate.id:
                    result.state, result.reason = "failed", f"step {label} failed: {failed_state.error}"
                else:
                    result.state = "pruned"
                    result.reason = (
                        f"shares step {label}, which failed in candidate {failed_state.candidate}: {_first_line(failed_state.error)}"
                    )
                self.on_event("candidate_end", {"candidate": candidate.id, "state": result.state, "reason": result.reason})
                return result
            model = state.artifact or model
        result.model = model
        if candidate.reference:
            self.references[candidate.target] = result
        reference = None if candidate.reference else self.references.get(candidate.target)
        self._evaluate(result, candidate.target, reference.model if reference and reference.state == "complete" else None)
        self.on_event(
            "candidate_end", {"candidate": candidate.id, "state": result.state, "reason": result.reason, "metrics": result.metrics}
        )
        return result

    def _first_failure(self, job_id: str) -> str:
        """The job that actually failed (a job whose input failed points at its input)."""
        while self.jobs[job_id].status == "skipped":
            parent = self.plan.jobs[job_id].parent
            assert parent is not None
            job_id = parent
        return job_id

    def _evaluate(self, result: CandidateResult, target_id: str, reference: ModelArtifact | None) -> None:
        model = result.model
        assert model is not None
        # cheap figures first; evaluations kept for passes (candidates: false) are not run here
        entries = sorted((e for e in self.resolved.evaluators.values() if e.candidates), key=lambda e: e.cls.timing)
        for entry in entries:
            if entry.cls.timing and not self.resolved.spec.search.time_infeasible:
                broken = cheap_violations(self.resolved, result, self.references.get(target_id))
                if broken:
                    result.untimed = True
                    result.violations = broken
                    break
            if entry.cls.needs_reference and reference is None and not result.candidate.reference:
                result.state, result.reason = "failed", f"{entry.id} needs the reference model of {target_id}, which failed"
                return
            refs = self._data_refs(entry.cls, entry.config)
            missing = [n for n in refs if n in self.dataset_errors]
            if missing:
                result.state, result.reason = "failed", f"dataset {missing[0]} could not be read: {self.dataset_errors[missing[0]]}"
                return
            key, key_doc = self.eval_key(entry, model.digest, reference.digest if reference else None, target_id)
            result.eval_keys[entry.id] = key
            if result.candidate.jobs:
                self.store.remember(self.slot(result.candidate.jobs[-1], entry.id, target_id), key, key_doc)
            record = self.store.lookup(key)
            if record is not None:
                with self._lock:
                    self.stats.evals_cached += 1
            else:
                with self.gate.exclusive() if entry.cls.timing else self.gate.shared():
                    self.on_event("eval_start", {"candidate": result.candidate.id, "evaluation": entry.id})
                    outcome: Outcome = self.executor.run(
                        {
                            "kind": "eval",
                            "key": key,
                            "key_doc": key_doc,
                            "plugin": entry.name,
                            "config": entry.config,
                            "model": model.to_json(),
                            "reference": reference.to_json() if reference else None,
                            "input_model": self.input.to_json(),
                            "target": target_spec(self.resolved, target_id),
                            "datasets": self._datasets_for(refs),
                        },
                        timeout_s=entry.timeout_s or entry.cls.default_timeout_s,
                    )
                if not outcome.ok:
                    result.state, result.reason = "failed", f"evaluation {entry.id} failed: {outcome.error}"
                    self.on_event(
                        "eval_end", {"candidate": result.candidate.id, "evaluation": entry.id, "ok": False, "error": outcome.error}
                    )
                    return
                record = outcome.record or {}
                with self._lock:
                    if outcome.shared:  # another run measured it while this one waited
                        self.stats.evals_cached += 1
                    else:
                        self.stats.evals_run += 1
                        self.stats.eval_seconds += float(record.get("duration_s") or 0.0)
                self.on_event("eval_end", {"candidate": result.candidate.id, "evaluation": entry.id, "ok": True})
            result.metrics.update({f"{entry.id}.{name}": value for name, value in record["values"].items()})
            result.samples.update({f"{entry.id}.{name}": sample for name, sample in (record.get("samples") or {}).items()})
            result.details[entry.id] = record.get("details") or {}
        result.state = "complete"

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
            datasets=self.dataset_keys,
            jobs=self.jobs,
            results=results,
            stats=self.stats,
            wall_s=time.perf_counter() - started,
        )


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if text and text.strip() else ""
