"""Writing a run's outputs: the chosen model(s), candidates.json, workflow.lock.json.

Each file and folder is written under a temporary name and renamed into place, so an output
folder never holds half a model or half a record.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

from engine import __version__, keys
from engine.core.config import library_versions
from engine.core.hashing import sha256_file
from engine.results import CandidateResult, RunReport
from engine.select import intervals_json, under_load
from engine.store import write_json_atomic


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
        state = report.jobs[job_id]
        steps.append(
            {
                "step": job.step_id,
                "pass": report.resolved.steps[job.step_id].pass_name,
                "config": job.config,
                "key": state.key,
                "digest": state.artifact.digest if state.artifact else None,
                "status": state.status,
                "details": (state.record or {}).get("details"),
                "notes": (state.record or {}).get("notes", []),
            }
        )
    return {
        "id": result.candidate.id,
        "target": result.candidate.target,
        "path": result.label,
        "params": result.candidate.params,
        "reference": result.candidate.reference,
        "state": result.state,
        "reason": result.reason,
        "feasible": result.feasible,
        "violations": result.violations,
        "chosen": result.chosen,
        "verdict": result.verdict,
        "tied_with": result.tied_with,
        "pareto": result.pareto,
        "model_digest": result.model.digest if result.model else None,
        "metrics": result.metrics,
        "intervals": intervals_json(result),
        "confidence": report.resolved.spec.select.confidence,
        "measured_under_load": under_load(result),
        "evaluations": {eid: {"key": key, "details": result.details.get(eid)} for eid, key in result.eval_keys.items()},
        "steps": steps,
    }


def lock_document(report: RunReport) -> dict[str, Any]:
    resolved = report.resolved
    libraries = sorted(
        {lib for s in resolved.steps.values() for lib in s.pass_cls.libraries}
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
        "input": {"format": report.input.format, "digest": report.input.digest, "attrs": report.input.attrs},
        "datasets": report.datasets,
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


def write_outputs(report: RunReport, output_dir: Path) -> Path:
    output_dir.mkdir(parents=True, exist_ok=True)
    keep = report.resolved.spec.output.keep
    for result in report.results:
        if result.model is None or result.state != "complete":
            continue
        if result.chosen:
            _copy_atomic(result.model.path, output_dir / result.candidate.target / "model")
        if keep == "all" or (keep == "pareto" and result.pareto):
            _copy_atomic(result.model.path, output_dir / result.candidate.target / "candidates" / result.candidate.id.split("/")[-1])
    write_json_atomic(
        output_dir / "candidates.json",
        {
            "workflow": report.resolved.name,
            "candidates": [candidate_record(report, r) for r in report.results],
            "skipped_targets": report.plan.skipped_targets,
            "notes": report.plan.dropped,
        },
    )
    write_json_atomic(output_dir / "workflow.lock.json", lock_document(report))
    report.output_dir = output_dir
    return output_dir
