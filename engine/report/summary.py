"""A run's short summary, for CI: per target the choice, the objective and the constraints with
their intervals and why; the exit code and its reason; the run id, workflow and wall time.

It is computed from the run's row in the history and the records the history keeps (the same
ones ``engine show`` reads), so ``engine run ... --summary FILE`` and ``engine show RUN --format
json|md`` give the same document. JSON follows ``summary.schema.json`` (a package data file,
printed by ``engine schema --summary``); Markdown is made for GitHub Actions' job summary
(``$GITHUB_STEP_SUMMARY``). Files are written atomically.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from engine.store.store import write_text_atomic
from engine.text.display import bound, number

#: the version of the summary's shape (``kiln_summary`` in the document, ``$id`` of the schema)
SUMMARY_VERSION = 1
FORMATS = ("md", "json")

_REASONS = {
    0: "a model was chosen for every available target",
    2: "invalid input: the message on stderr names the file, the key and the fix",
    3: "a bug in Kiln: the message on stderr names the file holding the traceback",
    4: "the store is damaged: run `engine verify --repair`, then the same command again",
    130: "interrupted: finished jobs are in the store; run the same command again to resume",
    141: "the reader closed the output pipe",
}


def summary_format(path: Path, given: str | None) -> str:
    """``given`` (--summary-format), else by the file's suffix: ``.json`` is JSON, anything else
    (``.md``, or no suffix, as ``$GITHUB_STEP_SUMMARY`` has none) Markdown."""
    if given:
        return given
    return "json" if path.suffix.lower() == ".json" else "md"


def schema() -> dict[str, Any]:
    """The JSON Schema a summary document follows."""
    text = resources.files("engine.report").joinpath("summary.schema.json").read_text(encoding="utf-8")
    return dict(json.loads(text))


def _when(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC).isoformat(timespec="seconds")


def _figure(record: Mapping[str, Any], metric: str) -> dict[str, Any]:
    interval = (record.get("intervals") or {}).get(metric)
    low, high = (interval.get("low"), interval.get("high")) if isinstance(interval, dict) else (None, None)
    value = (record.get("metrics") or {}).get(metric)
    return {"metric": metric, "value": value if isinstance(value, (int, float)) else None, "low": low, "high": high}


def _bounds(constraint: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(constraint[k]) for k in ("min", "max", "max_drop", "max_drop_ratio") if constraint.get(k) is not None}


def _chosen(record: Mapping[str, Any], select: Mapping[str, Any]) -> dict[str, Any]:
    objective = select["objective"]["metric"]
    evaluator = objective.split(".")[0]
    paired = f"{evaluator}.speedup"  # the speedup the objective's evaluator timed against the reference
    violations = record.get("violations") or []
    constraints = []
    for constraint in select.get("constraints") or []:
        metric = constraint["metric"]
        met = not any(v.startswith(f"{metric} ") for v in violations)
        constraints.append({**_figure(record, metric), "bounds": _bounds(constraint), "met": met})
    return {
        "candidate": record["id"],
        "path": record.get("path"),
        "reference": bool(record.get("reference")),
        "model_digest": record.get("model_digest"),
        "objective": _figure(record, objective),
        "speedup": _figure(record, paired) if paired in (record.get("metrics") or {}) and paired != objective else None,
        "constraints": constraints,
        "why": record.get("verdict"),
    }


def _why_none(records: list[Mapping[str, Any]]) -> str:
    complete = [r for r in records if r.get("state") == "complete"]
    failed = [r for r in records if r.get("state") == "failed"]
    if not records:
        return "no candidate was made for it"
    if not complete:
        first = f" (first: {failed[0]['id']}: {_first_line(failed[0].get('reason'))})" if failed else ""
        return f"no candidate completed: {len(failed)} failed{first}, {len(records) - len(failed)} not run or pruned"
    rejected = next((r for r in complete if r.get("violations")), None)
    example = f"; e.g. {rejected['id']}: {'; '.join(rejected['violations'])}" if rejected else ""
    return f"none of the {len(complete)} complete candidate(s) met the constraints{example}"


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if text and text.strip() else ""


def _targets(run: Mapping[str, Any], records: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    candidates = (records or {}).get("candidates") or {}
    lock_targets = ((records or {}).get("lock") or {}).get("targets") or {}
    skipped = candidates.get("skipped_targets") or {}
    select = candidates.get("select")
    found = []
    for target in dict.fromkeys([*(run.get("targets") or []), *lock_targets]):
        own = [c for c in candidates.get("candidates") or [] if c.get("target") == target]
        chosen = next((c for c in own if c.get("chosen")), None)
        availability = lock_targets.get(target) or {}
        entry: dict[str, Any] = {
            "id": target,
            "available": availability.get("available") if records else None,
            "skipped": skipped.get(target) or (availability.get("reason") if availability.get("available") is False else None),
            "chosen": _chosen(chosen, select) if chosen is not None and select else None,
            "why_none": None,
            "candidates": {
                "total": len(own),
                **{state: sum(c.get("state") == state for c in own) for state in ("complete", "failed", "pruned")},
                "feasible": sum(c.get("feasible") is True for c in own),
            },
        }
        if entry["chosen"] is None:
            entry["why_none"] = entry["skipped"] or (_why_none(own) if records else "the run recorded no results")
        found.append(entry)
    return found


def _reason(code: int | None, status: str, targets: list[dict[str, Any]]) -> str:
    if code is None:
        return f"no exit code recorded (the run is {status})"
    if code == 1:
        missing = [t for t in targets if t["chosen"] is None and not t["skipped"]]
        if missing:
            return f"no model chosen for {', '.join(t['id'] for t in missing)}: {missing[0]['why_none']}"
        return "some target got no model"
    return _REASONS.get(code, f"exit code {code}")


def build_summary(run: Mapping[str, Any], records: Mapping[str, Any] | None) -> dict[str, Any]:
    """The summary of a run from its history row (``id``, ``name``, ``workflow_path``, ``status``,
    ``exit_code``, ``wall_s``, ``started``, ``finished``, ``targets``, ``output_dir``,
    ``kiln_version``, ``host_summary``) and the records it kept (None when it wrote none)."""
    targets = _targets(run, records)
    select = ((records or {}).get("candidates") or {}).get("select")
    return {
        "kiln_summary": SUMMARY_VERSION,
        "run": {
            "id": run.get("id"),
            "workflow": run.get("name"),
            "workflow_file": run.get("workflow_path"),
            "kiln": run.get("kiln_version"),
            "host": run.get("host_summary"),
            "started": _when(run.get("started")),
            "finished": _when(run.get("finished")),
            "wall_s": run.get("wall_s"),
            "output": run.get("output_dir"),
        },
        "exit": {
            "code": run.get("exit_code"),
            "status": run.get("status"),
            "reason": run.get("exit_reason") or _reason(run.get("exit_code"), run["status"], targets),
        },
        "select": None
        if not select
        else {
            "objective": {"metric": select["objective"]["metric"], "goal": select["objective"]["goal"]},
            "constraints": [{"metric": c["metric"], "bounds": _bounds(c)} for c in select.get("constraints") or []],
            "confidence": select.get("confidence"),
        },
        "targets": targets,
    }


def to_json(summary: Mapping[str, Any]) -> str:
    return json.dumps(summary, indent=2, ensure_ascii=False) + "\n"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _figure_text(figure: Mapping[str, Any] | None, suffix: str = "") -> str:
    if not figure or figure.get("value") is None:
        return "—"
    text = number(figure["value"]) + suffix
    if figure.get("low") is not None and figure.get("high") is not None and figure["low"] != figure["high"]:
        text += f" [{number(figure['low'])}, {number(figure['high'])}]"
    return text


def _bounds_text(bounds: Mapping[str, float]) -> str:
    return ", ".join(f"{name.replace('_', ' ')} {bound(value)}" for name, value in bounds.items())


def to_markdown(summary: Mapping[str, Any]) -> str:
    """The summary as GitHub-flavoured Markdown: a heading with the outcome, one table row per
    target, and the run's facts (id, workflow, wall time, exit code and its reason)."""
    run, exit_, select = summary["run"], summary["exit"], summary.get("select")
    chosen = sum(t["chosen"] is not None for t in summary["targets"])
    lines = [f"### Kiln: {_cell(run['workflow'])}: a model for {chosen} of {len(summary['targets'])} target(s), exit {exit_['code']}", ""]
    if select:
        objective = select["objective"]
        header = ["target", "chosen", f"{objective['metric']} ({objective['goal']})", "vs reference"]
        header += [f"{c['metric']} ({_bounds_text(c['bounds'])})" for c in select["constraints"]] + ["why"]
        lines += ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
        for target in summary["targets"]:
            pick = target["chosen"]
            if pick is None:
                row = [target["id"], "none", "—", "—", *("—" for _ in select["constraints"]), target["why_none"] or ""]
            else:
                name = f"#{pick['candidate'].split('/')[-1]} {pick['path']}" + (" (reference)" if pick["reference"] else "")
                figures = [_figure_text(c) + ("" if c["met"] else " (not met)") for c in pick["constraints"]]
                row = [target["id"], name, _figure_text(pick["objective"]), _figure_text(pick["speedup"], "x"), *figures, pick["why"] or ""]
            lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
        lines.append("")
    wall = f"{run['wall_s']:.1f} s" if isinstance(run.get("wall_s"), (int, float)) else "—"
    lines.append(
        f"Run `{run['id'] or '(not recorded)'}` of `{_cell(run['workflow_file'])}` · wall {wall} · kiln {run['kiln']} · "
        f"exit {exit_['code']}: {_cell(exit_['reason'])}"
    )
    return "\n".join(lines) + "\n"


def render(summary: Mapping[str, Any], fmt: str) -> str:
    return to_json(summary) if fmt == "json" else to_markdown(summary)


def write_summary(path: Path, summary: Mapping[str, Any], fmt: str) -> Path:
    """Write ``summary`` to ``path`` as ``fmt``: a temporary file in the same folder, renamed."""
    write_text_atomic(path, render(summary, fmt))
    return path
