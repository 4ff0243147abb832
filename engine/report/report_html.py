"""report.html: one self-contained page of a run, written from the records the run left in its
output folder (candidates.json, workflow.lock.json, <target>/inference_settings.json and
inference.py) and nothing else (not events.jsonl, which logs every run into the folder), so
that a past run's page can be written again later. Per target: the (first) objective plotted
against each other objective and constraint metric (the chosen point marked, the reference, the
constraint bounds, intervals as error bars), the sortable candidate table, each candidate's
lineage, and the settings to deploy with; then failures and the environment. The plots are
plotly figures; plotly.js is embedded inline, so the page opens without a network."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from html import escape
from pathlib import Path
from typing import Any

from engine.core.errors import KilnError
from engine.report.report_figures import figures, objectives, value_of, why_of
from engine.text.display import flag, natural_key, number

REPORT_NAME = "report.html"

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}h1,h2,h3{font-weight:600}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f2f2f2}table.sortable th{cursor:pointer}table.sortable th:after{content:" \\2195";color:#999}
tr.chosen{background:#fff6d5}tr.failed{background:#fde8e8}code,pre{font-size:.85em}pre{background:#f7f7f7;padding:.5em;overflow:auto}
.plot{width:100%;max-width:900px;height:420px}h4.plot-title{margin:1em 0 0;font-weight:500}.muted{color:#777}ol.lineage li{margin:.2em 0}
"""

_SCRIPT = """
document.querySelectorAll('script.kiln-figure').forEach(function (s) {
  var f = JSON.parse(s.textContent);
  Plotly.newPlot(document.getElementById(s.dataset.div), f.data, f.layout, {responsive: true, displaylogo: false});
});
document.querySelectorAll('table.sortable th').forEach(function (th) {
  th.addEventListener('click', function () {
    var body = th.closest('table').tBodies[0], i = th.cellIndex, asc = th.dataset.dir !== 'asc';
    th.dataset.dir = asc ? 'asc' : 'desc';
    var key = function (row) { var c = row.cells[i]; return c.dataset.v !== undefined ? c.dataset.v : c.textContent; };
    Array.from(body.rows).sort(function (a, b) {
      var x = key(a), y = key(b), nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
      return asc ? c : -c;
    }).forEach(function (row) { body.appendChild(row); });
  });
});
"""


def write_report(output_dir: Path) -> Path:
    """Write ``output_dir/report.html`` from the run's records in that folder; returns its path."""
    return write_page(read_records(output_dir), output_dir / REPORT_NAME)


def write_page(records: dict[str, Any], path: Path) -> Path:
    """Render ``records`` into ``path`` atomically (a temporary file beside it, renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        staging.write_text(render(records), encoding="utf-8")
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)
    return path


def read_records(output_dir: Path) -> dict[str, Any]:
    """What a run wrote into its output folder, as the report needs it."""
    candidates_file = output_dir / "candidates.json"
    if not candidates_file.is_file():
        raise KilnError(f"{output_dir} holds no candidates.json: it is not the output folder of a Kiln run")
    candidates = json.loads(candidates_file.read_text(encoding="utf-8"))
    lock_file = output_dir / "workflow.lock.json"
    lock = json.loads(lock_file.read_text(encoding="utf-8")) if lock_file.is_file() else {}
    deploy: dict[str, dict[str, Any]] = {}
    for target in _targets(candidates):
        settings, program = output_dir / target / "inference_settings.json", output_dir / target / "inference.py"
        if settings.is_file():
            deploy[target] = {"settings": json.loads(settings.read_text(encoding="utf-8"))}
            if program.is_file():
                deploy[target]["program"] = program.read_text(encoding="utf-8")
    return {"candidates": candidates, "lock": lock, "deploy": deploy}


def _targets(candidates: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(c["target"] for c in candidates.get("candidates", [])))


def render(records: dict[str, Any]) -> str:
    """The whole page."""
    from plotly.offline import get_plotlyjs

    document = records["candidates"]
    name = document.get("workflow") or records["lock"].get("workflow", {}).get("name", "run")
    body = [f"<h1>{escape(str(name))}: report</h1>", _overview(records)]
    for target in _targets(document):
        rows = [c for c in document["candidates"] if c["target"] == target]
        body.append(_target_section(target, rows, document.get("select") or {}, records["deploy"].get(target)))
    body += [_failures(records), _environment(records["lock"])]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(str(name))}: Kiln report</title><style>{_STYLE}</style>"
        f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>\n'
        + "\n".join(body)
        + f"\n<script>{_SCRIPT}</script></body></html>\n"
    )


def _overview(records: dict[str, Any]) -> str:
    document, lock = records["candidates"], records["lock"]
    select = document.get("select") or {}
    items = [f"workflow file: <code>{escape(str(lock.get('workflow', {}).get('file', '?')))}</code>"]
    for objective in objectives(select):
        items.append(f"objective: <b>{escape(objective['metric'])}</b> ({escape(objective.get('goal', 'min'))})")
    for constraint in select.get("constraints", []):
        items.append(f"constraint: {escape(_constraint_text(constraint))}")
    for target, chosen in (lock.get("chosen") or {}).items():
        items.append(f"chosen for <b>{escape(target)}</b>: <code>{escape(chosen['candidate'])}</code>")
    return "<ul>" + "".join(f"<li>{item}</li>" for item in items) + "</ul>"


def _constraint_text(constraint: dict[str, Any]) -> str:
    parts = [f"{name} {constraint[name]:g}" for name in ("min", "max", "max_drop", "max_drop_ratio") if constraint.get(name) is not None]
    return f"{constraint['metric']}: " + ", ".join(parts)


def _target_section(target: str, rows: list[dict[str, Any]], select: dict[str, Any], deploy: dict[str, Any] | None) -> str:
    chosen = next((c for c in rows if c.get("chosen")), None)
    parts = [f'<section class="target" id="target-{escape(target)}"><h2>target {escape(target)}</h2>']
    if chosen:
        parts.append(
            f'<p class="chosen-summary">chosen: <b>{escape(chosen["id"])}</b> {escape(chosen["path"])}'
            f'<br><span class="muted">{escape(chosen.get("verdict") or "")}</span></p>'
        )
    else:
        parts.append("<p><b>no candidate completed and met the constraints</b></p>")
    if objectives(select):
        parts.append("<h3>objective against constraints</h3>")
        for figure in figures(rows, select):
            parts.append(f'<h4 class="plot-title">{escape(figure["title"])}</h4>')
            if figure["placed"] == 0:
                parts.append(
                    f"<p class='muted no-plot'>nothing to plot: no candidate of this target was measured on both {escape(figure['y'])} and {escape(figure['x'])}</p>"
                )
            else:
                parts.append(_figure_html(target, figure))
    parts += ["<h3>candidates</h3>", _table(rows, select), "<h3>lineage</h3>", _lineage(rows)]
    parts.append("<h3>inference settings to deploy with</h3>")
    if deploy:
        parts.append(f'<pre class="inference-settings">{escape(json.dumps(deploy["settings"], indent=2))}</pre>')
        if deploy.get("program"):
            parts.append(f"<details><summary>inference.py</summary><pre>{escape(deploy['program'])}</pre></details>")
    else:
        parts.append("<p class='muted'>none (nothing was chosen for this target)</p>")
    return "\n".join(parts) + "</section>"


def _figure_html(target: str, figure: dict[str, Any]) -> str:
    # the same records give the same page (a report written again by `engine show --html` is identical)
    div = "plot-" + hashlib.sha256(f"{target}\0{figure['x']}\0{figure['y']}".encode()).hexdigest()[:10]
    data = json.dumps(figure["figure"]).replace("</", "<\\/")
    return (
        f'<div class="plot" id="{div}"></div>'
        f'<script type="application/json" class="kiln-figure" data-div="{div}" data-target="{escape(target)}" '
        f'data-x="{escape(figure["x"])}" data-y="{escape(figure["y"])}">{data}</script>'
    )


def _number(value: float) -> str:
    return number(value)


def _metric_cell(candidate: dict[str, Any], metric: str) -> str:
    value = value_of(candidate, metric)
    if value is None:
        return '<td data-v="">—</td>'
    interval = (candidate.get("intervals") or {}).get(metric)
    spread = f' <span class="muted">[{_number(interval["low"])}, {_number(interval["high"])}]</span>' if interval else ""
    return f'<td data-v="{value!r}">{_number(value)}{spread}</td>'


def _table(rows: list[dict[str, Any]], select: dict[str, Any]) -> str:
    metrics = list(dict.fromkeys([o["metric"] for o in objectives(select)] + [c["metric"] for c in select.get("constraints", [])]))
    head = ["#", "path", "state", *metrics, "pareto", "why"]
    lines = ['<table class="sortable candidates"><thead><tr>' + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for c in sorted(rows, key=lambda c: natural_key(c["id"])):
        state = "★ chosen" if c.get("chosen") else c.get("state", "")
        why = why_of(c)
        css = "chosen" if c.get("chosen") else "failed" if c.get("state") == "failed" else ""
        number = c["id"].split("/")[-1]
        path = escape(c["path"]) + (' <span class="muted">(reference)</span>' if c.get("reference") else "")
        lines.append(
            f'<tr class="{css}" data-candidate="{escape(c["id"])}"><td data-v="{escape(number)}">{escape(number)}</td><td>{path}</td>'
            f"<td>{escape(state)}</td>"
            + "".join(_metric_cell(c, m) for m in metrics)
            + f"<td>{flag(bool(c.get('pareto')))}</td><td>{escape(why)}</td></tr>"
        )
    return "\n".join([*lines, "</tbody></table>"])


_CACHE = {"hit": "cache hit", "ran": "cache miss: ran", "shared": "built meanwhile by another run", "pending": "never reached"}


def _lineage(rows: list[dict[str, Any]]) -> str:
    """Each candidate's chain of passes from the input model; a job several candidates share
    (one node of the run's DAG) names the others."""
    users: dict[str, list[str]] = {}
    for c in rows:
        for step in c.get("steps", []):
            users.setdefault(step.get("key") or "", []).append(c["id"].split("/")[-1])
    parts = []
    for c in rows:
        steps = ["<li>input model</li>"]
        for step in c.get("steps", []):
            status = step.get("status", "")
            seconds = f" in {step['seconds']:.2f} s" if isinstance(step.get("seconds"), int | float) else ""
            config = {k: v for k, v in (step.get("config") or {}).items() if v not in (None, [], {})}
            steps.append(
                f'<li class="step" data-step="{escape(step["step"])}" data-status="{escape(status)}"><b>{escape(step["step"])}</b> '
                f"({escape(step['pass'])}) · {escape(_CACHE.get(status, status))}{seconds}"
                f" · digest <code>{escape((step.get('digest') or '—')[:16])}</code> · key <code>{escape((step.get('key') or '—')[:16])}</code>"
                + _shared(users.get(step.get("key") or "", []), c["id"].split("/")[-1])
                + (f'<br><span class="error">{escape(step["error"])}</span>' if step.get("error") else "")
                + f"<details><summary>config</summary><pre>{escape(json.dumps(config, indent=1))}</pre></details></li>"
            )
        evaluations = ", ".join(
            f"{escape(e)} <code>{escape((v.get('key') or '')[:12])}</code>" for e, v in (c.get("evaluations") or {}).items()
        )
        parts.append(
            f'<details class="lineage" data-candidate="{escape(c["id"])}"{" open" if c.get("chosen") else ""}>'
            f"<summary>{escape(c['id'])} {escape(c['path'])} → model <code>{escape((c.get('model_digest') or '—')[:16])}</code></summary>"
            f'<ol class="lineage">{"".join(steps)}</ol><p class="muted">evaluations: {evaluations or "none"}</p></details>'
        )
    return "\n".join(parts)


def _shared(users: list[str], own: str) -> str:
    others = [f"#{n}" for n in users if n != own]
    return f" · shared with {', '.join(others)}" if others else ""


def _failures(records: dict[str, Any]) -> str:
    document = records["candidates"]
    items = [
        f"<li>candidate <b>{escape(c['id'])}</b> ({escape(c['path'])}): {escape(c.get('reason') or 'failed')}</li>"
        for c in document.get("candidates", [])
        if c.get("state") == "failed"
    ]
    for c in document.get("candidates", []):
        items += [
            f"<li>step <b>{escape(step['step'])}</b> of {escape(c['id'])} ({escape(c['path'])}): {escape(str(step['error']))}</li>"
            for step in c.get("steps", [])
            if step.get("error")
        ]
    items += [
        f"<li>target <b>{escape(t)}</b> skipped: {escape(str(why))}</li>" for t, why in (document.get("skipped_targets") or {}).items()
    ]
    items += [f"<li class='muted'>note: {escape(str(note))}</li>" for note in document.get("notes") or []]
    return '<section id="failures"><h2>failures</h2>' + (f"<ul>{''.join(items)}</ul>" if items else "<p>none</p>") + "</section>"


def _environment(lock: dict[str, Any]) -> str:
    host, accelerators = lock.get("host") or {}, lock.get("accelerators") or {}
    rows = [
        ("engine", lock.get("engine")),
        ("python", lock.get("python")),
        ("platform", lock.get("platform")),
        ("CPU", f"{host.get('cpu', '?')} ({host.get('machine', '?')}, {host.get('cores', '?')} cores)"),
        ("ISA flags", ", ".join(host.get("isa") or [])),
        ("GPU", ", ".join(map(str, accelerators.get("nvidia") or [])) or "none"),
        ("CUDA driver", accelerators.get("cuda_driver") or "none"),
        ("accelerator libraries", ", ".join(map(str, accelerators.get("libraries") or [])) or "none"),
        ("workflow", f"{(lock.get('workflow') or {}).get('file', '?')} sha256 {(lock.get('workflow') or {}).get('sha256', '?')}"),
        ("input", f"{(lock.get('input') or {}).get('format', '?')} {(lock.get('input') or {}).get('digest', '?')}"),
    ]
    libraries = lock.get("libraries") if isinstance(lock.get("libraries"), dict) else {}
    rows += [(f"library {name}", version or "not installed") for name, version in sorted(libraries.items())]
    rows += [(f"target {t}", f"available: {v.get('available')} {v.get('reason') or ''}") for t, v in (lock.get("targets") or {}).items()]
    cells = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>" for k, v in rows)
    return f'<section id="environment"><h2>environment</h2><table class="environment">{cells}</table></section>'
