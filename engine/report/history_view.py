"""`engine runs`, `engine show RUN` and `engine compare RUN_A RUN_B`: the run history rendered
in the terminal (rich), and a past run's report.html written again from its records."""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from engine.core.errors import KilnError
from engine.report.history import History, RunRow, open_history
from engine.text.display import flag, natural_key, number
from engine.text.terminal import make_console

console = make_console()


def command(args: argparse.Namespace, store_root: Path) -> None:
    """`engine runs`, `engine show RUN [--html FILE]`, `engine compare RUN_A RUN_B`."""
    history = open_history(store_root)
    if args.command == "runs":
        print_runs(history, args.limit or None)
    elif args.command == "compare":
        print_compare(history, history.find(args.run_a), history.find(args.run_b), args.all_metrics)
    else:
        run = history.find(args.run)
        if getattr(args, "format", None):
            from engine.report.summary import build_summary, render

            print(render(build_summary(run.row, run["records"]), args.format), end="")
        else:
            print_show(history, run)
        if args.html:
            console.print(f"wrote {write_html_again(run, args.html)}")


def _when(timestamp: float | None) -> str:
    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S") if timestamp else "-"


def _wall(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.1f}min"


def _exit(run: RunRow) -> str:
    status, code = run["status"], run["exit_code"]
    return status if code is None else f"{status} ({code})"


def print_runs(history: History, limit: int | None) -> None:
    found = history.runs(limit)
    if not found:
        console.print(f"no runs recorded in {history.path}")
        return
    console.print(f"runs in {escape(str(history.path))}")
    table = Table(show_edge=False)
    # ids are kept whole (a person copies them into `engine show`); the other columns wrap
    table.add_column("run", no_wrap=True, min_width=max(len(run.id) for run in found))
    for column in ("started", "workflow", "chosen per target", "wall", "exit"):
        table.add_column(column, overflow="fold")
    for run in found:
        chosen = history.choices(run.id)
        picks = [f"{t}: {(chosen.get(t) or {}).get('candidate') or '-'}" for t in dict.fromkeys([*(run["targets"] or []), *chosen])]
        table.add_row(
            run.id,
            _when(run["started"]),
            escape(f"{run['name']}\n({Path(run['workflow_path']).name})"),
            escape("\n".join(picks) or "-"),
            _wall(run["wall_s"]),
            _exit(run),
        )
    console.print(table)


def print_show(history: History, run: RunRow) -> None:
    console.print(f"[bold]run {run.id}[/bold]: {escape(str(run['name']))} ({escape(str(run['workflow_path']))})")
    console.print(f"  started {_when(run['started'])}, finished {_when(run['finished'])}, wall time {_wall(run['wall_s'])}")
    console.print(f"  exit: {_exit(run)}; kiln {run['kiln_version']}; host {escape(str(run['host_summary'] or run['host']))}")
    console.print(f"  workflow sha256 {run['workflow_digest'] or '-'}; output {escape(str(run['output_dir']))}")
    found = history.metrics(run.id)
    choices = history.choices(run.id)
    console.print("candidates (metrics with an interval: those selection weighs):")
    table = Table(show_edge=False)
    rows = sorted(history.candidates(run.id), key=lambda c: natural_key(c["id"]))
    # ids and metric names are kept whole: one metric a line, its figures wrapping under it
    table.add_column("candidate", no_wrap=True, min_width=max((len(c["id"]) for c in rows), default=9))
    for column in ("state", "feasible", "chosen"):
        table.add_column(column, overflow="fold")
    names = [m for (_, m) in found]
    table.add_column("metrics", overflow="fold", min_width=min(40, max((len(m) + 12 for m in names), default=7)))
    for c in rows:
        own = {m: value for (cid, m), value in found.items() if cid == c["id"]}
        ranked = {m: v for m, v in own.items() if v["low"] is not None} or own  # those selection weighs: with an interval
        shown = "\n".join(_metric(m, v) for m, v in ranked.items())
        table.add_row(escape(c["id"]), c["state"] or "-", flag(c["feasible"]), flag(bool(c["chosen"])), escape(shown))
    console.print(table)
    for target, choice in choices.items():
        console.print(f"  {target}: chose {escape(str(choice['candidate']))}: {escape(str(choice['verdict'] or ''))}")


def _metric(name: str, m: dict[str, Any]) -> str:
    value = "-" if m["value"] is None else number(m["value"])
    interval = f" [{number(m['low'])}, {number(m['high'])}]" if m["low"] is not None and m["high"] is not None else ""
    return f"{name}={value}{interval}"


def write_html_again(run: RunRow, path: Path) -> Path:
    """`engine show RUN --html`: report.html of a past run, from the records its history holds."""
    from engine.report.report_html import write_page

    records = run["records"]
    if not records:
        raise KilnError(f"run {run.id} ({run['status']}) recorded no results: there is no report to write")
    return write_page(records, path)


def compare(history: History, a: RunRow, b: RunRow, all_metrics: bool = False) -> list[str]:
    """What changed from run ``a`` to run ``b``, one line each; of the metrics, those with an
    interval (those selection weighs) unless ``all_metrics``."""
    lines = []
    if a["workflow_digest"] != b["workflow_digest"] or a["workflow_path"] != b["workflow_path"]:
        lines.append(
            f"workflow: {a['workflow_path']} ({_short(a['workflow_digest'])}) → {b['workflow_path']} ({_short(b['workflow_digest'])})"
        )
    if a["kiln_version"] != b["kiln_version"]:
        lines.append(f"kiln: {a['kiln_version']} → {b['kiln_version']}")
    env_a, env_b = history.environment(a.id), history.environment(b.id)
    for kind in ("library", "host"):
        old, new = env_a.get(kind, {}), env_b.get(kind, {})
        for name in sorted(set(old) | set(new)):
            if old.get(name) != new.get(name):
                lines.append(f"{kind} {name}: {old.get(name, '(absent)')} → {new.get(name, '(absent)')}")
    lines += _candidate_changes(history, a, b, all_metrics)
    choice_a, choice_b = history.choices(a.id), history.choices(b.id)
    for target in sorted(set(choice_a) | set(choice_b)):
        before, after = (choice_a.get(target) or {}).get("candidate"), (choice_b.get(target) or {}).get("candidate")
        lines.append(f"choice {target}: {before or '(none)'} → {after or '(none)'}" + ("" if before != after else " (unchanged)"))
    return lines


def _candidate_changes(history: History, a: RunRow, b: RunRow, all_metrics: bool) -> list[str]:
    lines = []
    cands_a = {c["id"]: c for c in history.candidates(a.id)}
    cands_b = {c["id"]: c for c in history.candidates(b.id)}
    lines += [f"candidate removed: {cid} ({cands_a[cid]['path']})" for cid in cands_a if cid not in cands_b]
    lines += [f"candidate added: {cid} ({cands_b[cid]['path']})" for cid in cands_b if cid not in cands_a]
    for cid in sorted(cands_a.keys() & cands_b.keys(), key=natural_key):
        if cands_a[cid]["state"] != cands_b[cid]["state"]:
            lines.append(f"candidate {cid}: state {cands_a[cid]['state']} → {cands_b[cid]['state']}")
    metrics_a, metrics_b = history.metrics(a.id), history.metrics(b.id)
    for key in sorted(metrics_a.keys() & metrics_b.keys(), key=lambda k: (natural_key(k[0]), k[1])):
        old, new = metrics_a[key], metrics_b[key]
        if old["value"] == new["value"] and old["low"] == new["low"] and old["high"] == new["high"]:
            continue
        if not all_metrics and old["low"] is None and new["low"] is None:
            continue
        lines.append(f"metric {key[0]} {_metric(key[1], old)} → {_metric(key[1], new)}{_overlap(old, new)}")
    return sorted(lines, key=lambda line: (not line.startswith("candidate"), natural_key(line)))


def _overlap(old: dict[str, Any], new: dict[str, Any]) -> str:
    if None in (old["low"], old["high"], new["low"], new["high"]):
        return ""
    if old["low"] <= new["high"] and new["low"] <= old["high"]:
        return " (intervals overlap: not a clear change)"
    return " (intervals apart: a real change)"


def _short(digest: str | None) -> str:
    return digest[:12] if digest else "-"


def print_compare(history: History, a: RunRow, b: RunRow, all_metrics: bool = False) -> None:
    console.print(f"[bold]{a.id}[/bold] ({_when(a['started'])}) → [bold]{b.id}[/bold] ({_when(b['started'])})")
    lines = compare(history, a, b, all_metrics)
    for line in lines:
        console.print(f"  {escape(line)}")
    if not lines:
        console.print("  nothing changed")
