"""The run summary's candidate table: one row per candidate with its state, the objective and
constraint metrics with their intervals, its speedup over its target's reference and why it won or
lost. On a terminal it is fitted to the terminal's width (cells wrap); written to a file or a pipe
(a CI log, ``| tee``) it is laid out at the width its content needs, one line per candidate, no
cell ever wrapped: a log viewer wraps long lines itself, and grep finds a candidate's whole row.
The free-text "why" column comes last, so the aligned figures stay at the left however long it
is. (A key: value block per candidate was the other choice; one line each keeps a candidate to
one grep hit and the table as compact as the figures allow.)"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from engine.select.results import CandidateResult, RunReport
from engine.select.select import paired_metric
from engine.text.display import natural_key, number, speedup

#: the width a piped table is laid out in: wider than any row, so the content decides
UNBOUNDED = 100_000


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if text and text.strip() else ""


def _state(result: CandidateResult) -> str:
    """The candidate's state as candidates.json writes it (complete, failed, pruned, inapplicable, pending), a
    complete one marked chosen or rejected by the selection."""
    state = str(result.state)
    if result.state == "failed":
        return f"[red]{state}[/red]"
    if result.state != "complete":
        return f"[yellow]{state}[/yellow]"
    if result.chosen:
        return f"[bold green]{state} ★ chosen[/bold green]"
    if result.feasible is False:
        return f"{state} [yellow]rejected[/yellow]"
    return state


def _with_interval(result: CandidateResult, metric: str) -> str:
    text = number(result.metrics.get(metric))
    interval = result.intervals.get(metric)
    if interval is not None and interval.low != interval.high:
        text += f" [dim][{number(interval.low)}, {number(interval.high)}][/dim]"
    return text


def paired_speedup(result: CandidateResult, paired: str) -> str:
    """The candidate's one speedup: the paired figure (timed round by round against the
    reference) with its interval; ``—`` where it was not measured."""
    interval = result.intervals.get(paired)
    if interval is None:
        return speedup(result.metrics.get(paired))
    return speedup(result.metrics.get(paired), interval.low, interval.high)


def _vs_reference(result: CandidateResult, ref: CandidateResult | None, objective: str, goal: str, paired: str | None) -> str:
    """The candidate against its target's reference: where the objective's evaluator measures a
    paired speedup, that one (never a ratio of separately measured times beside it); else the
    ratio of the two objective values."""
    if paired:
        return paired_speedup(result, paired)
    value = result.metrics.get(objective)
    ref_value = ref.metrics.get(objective) if ref else None
    if value and ref_value:
        return f"{(ref_value / value if goal == 'min' else value / ref_value):.2f}x"
    return "—"


def candidates_table(report: RunReport) -> Table:
    spec = report.resolved.spec.select
    objective = spec.primary.metric
    columns = [objective] + [c.metric for c in spec.constraints if c.metric != objective]
    table = Table(title=f"{report.resolved.name}: candidates", title_justify="left")
    for name in ("target", "#", "path", "state", *columns):
        table.add_column(name, justify="right" if name in columns else "left", overflow="fold")
    table.add_column("vs reference", justify="right", overflow="fold")
    table.add_column("why", overflow="fold")
    paired = paired_metric(report.resolved, objective)
    for target in report.resolved.targets:
        rows = sorted((r for r in report.results if r.candidate.target == target), key=lambda r: natural_key(r.candidate.id))
        ref = next((r for r in rows if r.candidate.reference), None)
        for result in rows:
            why = "; ".join(result.violations) if result.violations else (result.verdict or _first_line(result.reason))
            label = result.label + (" [dim](reference)[/dim]" if result.candidate.reference else "")
            table.add_row(
                target,
                result.candidate.id.split("/")[-1],
                label,
                _state(result),
                *(_with_interval(result, c) for c in columns),
                _vs_reference(result, ref, objective, spec.primary.goal, paired),
                why,
            )
    return table


def unbounded(console: Console) -> Console:
    """A console on ``console``'s stream that never wraps: for output that is not a terminal."""
    return Console(file=console.file, width=UNBOUNDED, highlight=False, soft_wrap=True, color_system=None)


def print_candidates(console: Console, report: RunReport) -> None:
    """The table on ``console``: fitted to a terminal; else one unwrapped line per candidate."""
    table = candidates_table(report)
    if console.is_terminal:
        console.print(table)
        return
    for column in table.columns:
        column.no_wrap, column.overflow = True, "ignore"
    unbounded(console).print(table)
