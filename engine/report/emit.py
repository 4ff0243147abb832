"""Writing a run's outputs: the chosen model(s), candidates.json, workflow.lock.json.

Everything is written into a temporary folder beside the output folder, which is then switched
into place with renames: an output folder never holds a model without its records, nor half of
either. A model from the store is hashed in full before it is delivered.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

from engine import __version__
from engine.core.config import library_versions
from engine.core.hashing import sha256_file
from engine.core.target import Target
from engine.execute.outdir import check_output_dir
from engine.plan import keys
from engine.report.report_html import write_report
from engine.select.results import CandidateResult, RunReport
from engine.select.select import intervals_json, under_load
from engine.store.store import Store, StoreDamaged, write_json_atomic


def _copy_atomic(source: Path, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = destination.parent / f".{destination.name}.{uuid.uuid4().hex[:8]}.tmp"
    if source.is_dir():
        shutil.copytree(source, staging)
    else:
        staging.mkdir()
        shutil.copy2(source, staging / source.name)
    if destination.exists():
        old = destination.parent / f".{destination.name}.{uuid.uuid4().hex[:8]}.old"
        os.replace(destination, old)
        os.replace(staging, destination)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, destination)


def candidate_record(report: RunReport, result: CandidateResult) -> dict[str, Any]:
    plan = report.plan
    steps = []
    for job_id in result.candidate.jobs:
        job = plan.jobs[job_id]
        state = report.jobs.get(job_id)
        if state is None:  # never reached (the search stopped first): still listed, with no state
            steps.append({"step": job.step_id, "pass": report.resolved.steps[job.step_id].pass_name, "status": "pending"})
            continue
        steps.append(
            {
                "step": job.step_id,
                "pass": report.resolved.steps[job.step_id].pass_name,
                "config": job.config,
                "key": state.key,
                "digest": state.artifact.digest if state.artifact else None,
                "status": state.status,
                "seconds": (state.record or {}).get("duration_s"),
                "error": state.error,
                "details": (state.record or {}).get("details"),
                "notes": (state.record or {}).get("notes", []),
                **({"node": state.node} if state.node else {}),  # where it ran (not on a store hit)
            }
        )
    return {
        "id": result.candidate.id,
        "target": result.candidate.target,
        "path": result.label,
        "params": result.candidate.params,
        "settings": result.candidate.settings,
        "reference": result.candidate.reference,
        "state": result.state,
        "reason": result.reason,
        "feasible": result.feasible,
        "violations": result.violations,
        "chosen": result.chosen,
        "verdict": result.verdict,
        "tied_with": result.tied_with,
        "runoffs": result.runoffs,
        "pareto": result.pareto,
        "model_digest": result.model.digest if result.model else None,
        "metrics": result.metrics,
        "intervals": intervals_json(result),
        "confidence": report.resolved.spec.select.confidence,
        "measured_under_load": under_load(result),
        "evaluations": {eid: _evaluation(result, eid, key) for eid, key in result.eval_keys.items()},
        "steps": steps,
    }


def _evaluation(result: CandidateResult, eid: str, key: str) -> dict[str, Any]:
    node = result.eval_nodes.get(eid)  # where it ran (not on a store hit)
    return {"key": key, "details": result.details.get(eid), **({"node": node} if node else {})}


def lock_document(report: RunReport) -> dict[str, Any]:
    resolved = report.resolved
    libraries = sorted(
        {lib for s in resolved.steps.values() if s.environment is None for lib in s.pass_cls.libraries}
        | {lib for e in resolved.evaluators.values() for lib in e.cls.libraries}
        | {lib for t in resolved.targets.values() for lib in t.cls.libraries}
    )
    return {
        "workflow": {"name": resolved.name, "file": resolved.file.name, "sha256": sha256_file(resolved.file)},
        "engine": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": keys.host_fingerprint(),
        "accelerators": keys.accelerator_fingerprint(),
        "libraries": library_versions(libraries),
        "environments": environments_document(resolved),
        "input": {"format": report.input.format, "digest": report.input.digest, "attrs": report.input.attrs},
        "datasets": report.datasets,
        "hub_datasets": {
            name: {key: entry.config.get(key) for key in ("name", "config", "hf_split", "revision", "commit")}
            for name, entry in resolved.datasets.items()
            if getattr(entry.cls, "hub_dataset", False)
        },
        "targets": {
            tid: {"fingerprint": t.instance.fingerprint(), "available": t.availability.ok, "reason": t.availability.reason}
            for tid, t in resolved.targets.items()
        },
        "plugins": {
            "passes": {s.pass_name: s.pass_cls.version for s in resolved.steps.values()},
            "evaluators": {e.name: e.cls.version for e in resolved.evaluators.values()},
        },
        "jobs": {
            state.key: {
                "step": report.plan.jobs[job_id].step_id,
                "config": report.plan.jobs[job_id].config,
                "digest": state.artifact.digest if state.artifact else None,
                "status": state.status,
            }
            for job_id, state in report.jobs.items()
            if state.key
        },
        "chosen": {
            target: {"candidate": r.candidate.id, "model_digest": r.model.digest if r.model else None}
            for target, r in report.chosen().items()
        },
    }


def environments_document(resolved: Any) -> dict[str, Any]:
    """The isolated environments the run used, by key: their requirements, who ran there, the
    versions of those steps' libraries, and the exact version of every package they hold."""
    documents: dict[str, Any] = {}
    for key, built in sorted(resolved.environments.items()):
        steps = sorted(s.id for s in resolved.steps.values() if s.environment is not None and s.environment.key() == key)
        targets = sorted(
            tid
            for tid, t in resolved.targets.items()
            if getattr(t.instance.config, "environment", None) and t.instance.config.environment.key() == key
        )
        libraries = sorted({lib for s in resolved.steps.values() if s.id in steps for lib in s.pass_cls.libraries})
        documents[key] = {
            "requirements": list(built.requirements),
            "steps": steps,
            "targets": targets,
            "libraries": built.library_versions(libraries),
            "packages": built.packages,
            "versions": dict(built.versions),
        }
    return documents


def _deliverable(store: Store, result: CandidateResult) -> Path:
    """The chosen model's folder, after a full check when it comes from the store."""
    model = result.model
    assert model is not None
    if model.path.parent == store.objects:
        why = store.check_object(model.digest, model.format, full=True)
        if why:
            store.discard_object(model.digest)
            raise StoreDamaged(
                f"the stored model of {result.candidate.id} ({model.digest}) {why}; it was removed from the store. "
                "Run the same command again to rebuild it."
            )
    return model.path


def write_outputs(report: RunReport, output_dir: Path) -> Path:
    check_output_dir(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = output_dir.parent / f".{output_dir.name}.{uuid.uuid4().hex[:8]}.tmp"
    staging.mkdir()
    try:
        _write_into(report, staging, output_dir)
        _switch(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    report.output_dir = output_dir
    return output_dir


def _write_into(report: RunReport, folder: Path, output_dir: Path) -> None:
    keep = report.resolved.spec.output.keep
    for result in report.results:
        if result.model is None or result.state != "complete":
            continue
        if result.chosen:
            _copy_atomic(_deliverable(report.store, result), folder / result.candidate.target / "model")
            write_inference_settings(report, result, folder / result.candidate.target)
        if keep == "all" or (keep == "pareto" and result.pareto):
            _copy_atomic(result.model.path, folder / result.candidate.target / "candidates" / result.candidate.id.split("/")[-1])
    write_json_atomic(
        folder / "candidates.json",
        {
            "workflow": report.resolved.name,
            "select": report.resolved.spec.select.model_dump(mode="json"),
            "candidates": [candidate_record(report, r) for r in report.results],
            "skipped_targets": report.plan.skipped_targets,
            "notes": report.plan.dropped,
        },
    )
    write_json_atomic(folder / "workflow.lock.json", lock_document(report))
    events = output_dir / "events.jsonl"
    if events.is_file():
        shutil.copy2(events, folder / "events.jsonl")  # this run's log (EventLog wrote it fresh)
    write_report(folder)  # from the records just written, as `engine show RUN --html` writes it again


#: evaluations whose details carry the session a model was measured with, most telling first
_MEASURED_BY = ("latency", "throughput", "memory")


def measured_session(report: RunReport, result: CandidateResult) -> tuple[str | None, dict[str, Any]]:
    """(evaluation id, its details) of the evaluation that timed the candidate's session: the
    settings in force when it was measured. (None, {}) when nothing timed it."""
    entries = report.resolved.evaluators
    ranked = sorted(
        (eid for eid in result.details if eid in entries and isinstance(result.details[eid].get("session"), dict)),
        key=lambda eid: _MEASURED_BY.index(entries[eid].name) if entries[eid].name in _MEASURED_BY else len(_MEASURED_BY),
    )
    return (ranked[0], result.details[ranked[0]]) if ranked else (None, {})


def inference_settings(report: RunReport, result: CandidateResult, target: Target) -> dict[str, Any]:
    """What an application needs to run the chosen model as it was measured: the document of
    ``target`` (the candidate's target with its settings: providers, options, session options,
    binding) from the session details in force, plus the model file, the shapes it was timed at
    and where the figures come from."""
    assert result.model is not None
    evaluation, details = measured_session(report, result)
    session = details.get("session") or {}
    model_file, path = result.model.model_file, result.model.path
    relative = model_file.relative_to(path) if path.is_dir() else Path(model_file.name)
    return {
        "kiln": __version__,
        "candidate": result.candidate.id,
        "target": result.candidate.target,
        "model": "model" if relative == Path(".") else f"model/{relative.as_posix()}",
        "searched_settings": result.candidate.settings,
        **target.inference_settings(session),
        "measured": {
            "by": evaluation,
            "io_binding": details.get("io_binding", session.get("io_binding")),
            "batch_size": details.get("batch_size"),
            "input_shapes": details.get("input_shapes"),
            "input_dtypes": details.get("input_dtypes"),
        }
        if evaluation
        else None,
    }


def write_inference_settings(report: RunReport, result: CandidateResult, folder: Path) -> None:
    """``inference_settings.json`` and ``inference.py`` (the session opened as measured) beside
    a chosen model. ``folder`` lies in the staging folder ``write_outputs`` switches into place
    whole, so the program is written plainly (the JSON goes through the same writer as the
    other records)."""
    target = report.resolved.targets[result.candidate.target].variant(result.candidate.settings)
    document = inference_settings(report, result, target)
    write_json_atomic(folder / "inference_settings.json", document)
    snippet = target.snippet(document, document["model"])
    if snippet:
        (folder / "inference.py").write_text(snippet)


def _switch(staging: Path, output_dir: Path) -> None:
    """Put ``staging`` where ``output_dir`` is: two renames, the old folder removed after."""
    if not output_dir.exists():
        os.replace(staging, output_dir)
        return
    old = output_dir.parent / f".{output_dir.name}.{uuid.uuid4().hex[:8]}.old"
    os.replace(output_dir, old)
    os.replace(staging, output_dir)
    shutil.rmtree(old, ignore_errors=True)
