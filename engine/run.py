"""One run of a workflow: datasets, pass jobs, evaluations, selection. Every arrow of the flow is a
function here; the CLI only renders what they return."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine import keys, registry
from engine.core.artifact import ModelArtifact
from engine.core.hashing import sha256_json
from engine.executor import LocalExecutor, Outcome
from engine.planner import Candidate, build_plan
from engine.results import CandidateResult, JobState, RunReport, Stats
from engine.select import select
from engine.store import Store
from engine.workflow.resolve import ResolvedWorkflow

EventSink = Callable[[str, dict[str, Any]], None]


def _noop(kind: str, fields: dict[str, Any]) -> None:
    return None


def input_artifact(resolved: ResolvedWorkflow, store: Store) -> ModelArtifact:
    spec = resolved.input
    extra = {"function": spec.attrs["function"], "kwargs": spec.attrs.get("kwargs", {})} if spec.format == "torch" else None
    digest = store.cached_digest(spec.path, spec.format, extra)
    return ModelArtifact(format=spec.format, path=spec.path, digest=digest, attrs=dict(spec.attrs))


def target_spec(resolved: ResolvedWorkflow, target_id: str) -> dict[str, Any]:
    entry = resolved.targets[target_id]
    return {"runtime": entry.cls.runtime, "config": entry.instance.config.to_json()}


class Runner:
    def __init__(
        self, resolved: ResolvedWorkflow, store: Store, on_event: EventSink = _noop, executor: LocalExecutor | None = None
    ) -> None:
        self.resolved = resolved
        self.store = store.ensure()
        self.on_event = on_event
        self.executor = executor or LocalExecutor(self.store)
        self.stats = Stats()
        self.plan = build_plan(resolved)
        self.input = input_artifact(resolved, self.store)
        self.dataset_keys: dict[str, str] = {}
        self.dataset_docs: dict[str, dict[str, Any]] = {}
        self.dataset_paths: dict[str, str] = {}
        self.dataset_errors: dict[str, str] = {}
        self.jobs: dict[str, JobState] = {job_id: JobState(job_id) for job_id in self.plan.job_order()}

    # -- keys (computable without running anything: `engine plan` uses them) ---------------------
    def compute_dataset_keys(self) -> dict[str, str]:
        for name, entry in self.resolved.datasets.items():
            file_digests = {
                option: self.store.cached_digest(Path(entry.config[option]), "file")
                for option in entry.cls.path_options
                if entry.config.get(option) and entry.config[option] not in entry.cls.path_sentinels
            }
            self.dataset_keys[name], self.dataset_docs[name] = keys.dataset_key(entry.cls, entry.config, file_digests, self.input.digest)
        return self.dataset_keys

    def _data_refs(self, cls: Any, config: dict[str, Any]) -> dict[str, str]:
        names = [config[o] for o in getattr(cls, "dataset_options", ()) if isinstance(config.get(o), str)]
        return {name: self.dataset_keys[name] for name in names}

    def _evaluations_for(self, cls: Any, config: dict[str, Any]) -> dict[str, Any]:
        """The workflow evaluations a pass measures with (``evaluation_options``), by id."""
        ids = [config[o] for o in getattr(cls, "evaluation_options", ()) if isinstance(config.get(o), str)]
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
        return keys.pass_key(
            step.pass_cls,
            job.config,
            input_digest,
            self._pass_data_refs(step.pass_cls, job.config),
            target,
            self._evaluations_for(step.pass_cls, job.config),
        )

    def eval_key(self, entry: Any, model_digest: str, reference_digest: str | None, target_id: str) -> tuple[str, dict[str, Any]]:
        """An evaluation's key: the datasets it reads by key, the files it names by content."""
        refs = self._data_refs(entry.cls, entry.config)
        files = {
            f"file:{o}": self.store.cached_digest(Path(entry.config[o]), "file") for o in entry.cls.path_options if entry.config.get(o)
        }
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
                    }
                )
                if not outcome.ok:
                    self.dataset_errors[name] = outcome.error or "failed"
                    self.on_event("dataset_end", {"name": name, "ok": False, "error": outcome.error})
                    continue
                record = outcome.record or {}
                self.stats.datasets_run += 1
            else:
                self.stats.datasets_cached += 1
            self.dataset_paths[name] = str(self.store.object_path(record["digest"]) / "dataset.npz")
            self.on_event("dataset_end", {"name": name, "ok": True, "samples": record.get("samples")})

    # -- passes -------------------------------------------------------------------------------
    def run_jobs(self) -> None:
        for job_id in self.plan.job_order():
            job = self.plan.jobs[job_id]
            state = self.jobs[job_id]
            parent = self.input if job.parent is None else self.jobs[job.parent].artifact
            if parent is None:
                state.status, state.error = (
                    "upstream-failed",
                    f"its input, {self.plan.jobs[job.parent].label if job.parent else 'the input'}, failed",
                )
                continue
            step = self.resolved.steps[job.step_id]
            missing = [n for n in self._pass_data_refs(step.pass_cls, job.config) if n in self.dataset_errors]
            if missing:
                state.status, state.error = "failed", f"dataset {missing[0]} could not be read: {self.dataset_errors[missing[0]]}"
                continue
            state.key, key_doc = self.job_key(job_id, parent.digest)
            self.store.remember(self.slot(job_id), state.key, key_doc)
            record = self.store.lookup(state.key)
            if record is not None:
                state.status = "hit"
                self.stats.passes_cached += 1
                self.on_event("job_end", {"job": job.label, "status": "hit"})
            else:
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
                    timeout_s=step.timeout_s,
                )
                if not outcome.ok:
                    state.status, state.error = "failed", outcome.error
                    self.on_event("job_end", {"job": job.label, "status": "failed", "error": outcome.error})
                    continue
                record = outcome.record or {}
                state.status = "ran"
                self.stats.passes_run += 1
                self.stats.pass_seconds += float(record.get("duration_s") or 0.0)
                self.on_event("job_end", {"job": job.label, "status": "ran", "seconds": record.get("duration_s")})
            state.record = record
            state.artifact = ModelArtifact(
                format=record["format"],
                path=self.store.object_path(record["digest"]),
                digest=record["digest"],
                attrs=record.get("attrs") or {},
            )

    # -- evaluations --------------------------------------------------------------------------
    def _candidate_model(self, candidate: Candidate) -> tuple[ModelArtifact | None, str | None]:
        if not candidate.jobs:
            return self.input, None
        for job_id in candidate.jobs:
            state = self.jobs[job_id]
            if state.status in ("failed", "upstream-failed"):
                return None, f"step {self.plan.jobs[job_id].label} failed: {state.error}"
        return self.jobs[candidate.jobs[-1]].artifact, None

    def evaluate(self) -> list[CandidateResult]:
        results = []
        for target_id in self.resolved.targets:
            candidates = self.plan.candidates_of(target_id)
            reference_model = None
            for candidate in candidates:  # the reference comes first
                result = CandidateResult(candidate=candidate, label=self.plan.label(candidate))
                results.append(result)
                model, error = self._candidate_model(candidate)
                if model is None:
                    result.state, result.reason = "failed", error
                    continue
                result.model = model
                if candidate.reference:
                    reference_model = model
                self._evaluate_one(result, target_id, None if candidate.reference else reference_model)
        return results

    def _evaluate_one(self, result: CandidateResult, target_id: str, reference: ModelArtifact | None) -> None:
        model = result.model
        assert model is not None
        entries = sorted(self.resolved.evaluators.values(), key=lambda e: e.cls.timing)  # cheap figures first
        for entry in entries:
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
                self.stats.evals_cached += 1
            else:
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
                    timeout_s=entry.timeout_s,
                )
                if not outcome.ok:
                    result.state, result.reason = "failed", f"evaluation {entry.id} failed: {outcome.error}"
                    self.on_event(
                        "eval_end", {"candidate": result.candidate.id, "evaluation": entry.id, "ok": False, "error": outcome.error}
                    )
                    return
                record = outcome.record or {}
                self.stats.evals_run += 1
                self.stats.eval_seconds += float(record.get("duration_s") or 0.0)
                self.on_event("eval_end", {"candidate": result.candidate.id, "evaluation": entry.id, "ok": True})
            result.metrics.update({f"{entry.id}.{name}": value for name, value in record["values"].items()})
            result.details[entry.id] = record.get("details") or {}
        result.state = "complete"


def run_workflow(resolved: ResolvedWorkflow, store: Store, on_event: EventSink = _noop, executor: LocalExecutor | None = None) -> RunReport:
    """Run every job and evaluation the plan needs (cache first) and rank the candidates."""
    started = time.perf_counter()
    runner = Runner(resolved, store, on_event, executor)
    on_event("plan", {"jobs": len(runner.plan.jobs), "candidates": len(runner.plan.candidates), "skipped": runner.plan.skipped_targets})
    runner.materialize_datasets()
    runner.run_jobs()
    results = runner.evaluate()
    select(resolved, results)
    report = RunReport(
        resolved=resolved,
        plan=runner.plan,
        store=runner.store,
        input=runner.input,
        datasets=runner.dataset_keys,
        jobs=runner.jobs,
        results=results,
        stats=runner.stats,
    )
    report.wall_s = time.perf_counter() - started
    return report
