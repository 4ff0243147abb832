"""Terminal rendering (rich): progress lines, the plan, the summary table, plugin listings.
Only the CLI calls this module; plugins never print."""

from __future__ import annotations

import json
import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from engine import registry
from engine.core.artifact import ModelArtifact
from engine.core.errors import KilnError
from engine.core.refs import without_markers
from engine.core.stats import Interval
from engine.execute.hooks import Hooks
from engine.plan.jobs import PassSpec
from engine.report.candidates_table import candidates_table as _candidates_table  # noqa: F401 (tests read it here)
from engine.report.candidates_table import paired_speedup, print_candidates, unbounded
from engine.report.plan_status import BLOCKED, HIT, MISS, PlanStatus
from engine.select.results import CandidateResult, RunReport
from engine.select.select import paired_metric, under_load
from engine.text.display import flag, number, space_text
from engine.text.terminal import make_console
from engine.text.typetext import type_text

# as wide as COLUMNS, else the terminal, else (a pipe, a CI log) engine.text.display.PIPED_WIDTH
console: Console = make_console()


class Progress(Hooks):
    """Renders the run's progress as terminal lines (nothing when ``quiet``)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.started = time.perf_counter()

    def _line(self, text: str) -> None:
        if not self.quiet:
            # a line each: wrapped on a terminal only (a CI log or a file keeps every line whole)
            console.print(f"[dim]{time.perf_counter() - self.started:7.1f}s[/dim] {text}", soft_wrap=not console.is_terminal)

    def study_opened(self, target: str, study: str, note: str) -> None:
        self._line(f"{escape(target)}: the search {escape(note)}")

    def model_download_started(self, model: str, commit: str, files: int) -> None:
        self._line(f"downloading {escape(model)} (commit {commit[:12]}, {files} files) from the Hugging Face Hub…")

    def model_download_done(self, model: str, commit: str, seconds: float) -> None:
        self._line(f"{escape(model)} downloaded in {seconds:.1f} s")

    def environment_started(self, key: str, requirements: list[str]) -> None:
        self._line(f"building environment {key[:12]} ({', '.join(requirements)})…")

    def environment_done(self, key: str, seconds: float) -> None:
        self._line(f"environment {key[:12]} built in {seconds:.1f} s")

    def dataset_started(self, name: str) -> None:
        self._line(f"dataset {name}: reading")

    def dataset_failed(self, name: str, error: str | None) -> None:
        self._line(f"dataset {name}: [red]failed[/red]: {error}")

    def job_cached(self, job: PassSpec) -> None:
        self._line(f"[dim]cache {job.label}[/dim]")

    def job_started(self, job: PassSpec) -> None:
        self._line(f"run   {job.label}")

    def job_done(self, job: PassSpec, status: str, seconds: float | None) -> None:
        if status == "hit":
            self.job_cached(job)
        else:
            self._line(f"[green]done[/green]  {job.label} ({seconds} s)")

    def job_failed(self, job: PassSpec, error: str | None) -> None:
        self._line(f"[red]fail[/red]  {job.label}: {_first_line(error)}")

    def eval_started(self, candidate: str, evaluation: str) -> None:
        self._line(f"eval  {candidate} {evaluation}")

    def eval_failed(self, candidate: str, evaluation: str, error: str | None) -> None:
        self._line(f"[red]fail[/red]  {candidate} {evaluation}: {_first_line(error)}")


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if text and text.strip() else ""


def _num(value: float | None) -> str:
    return number(value)


def print_summary(report: RunReport) -> None:
    """The run's summary on the console: on a terminal fitted to its width; written to a file or
    a pipe, every line whole (the table one line per candidate: engine.report.candidates_table)."""
    spec = report.resolved.spec.select
    objective = spec.primary.metric
    out = console if console.is_terminal else unbounded(console)
    print_candidates(console, report)
    if spec.confidence is not None:
        out.print(
            f"[dim]intervals: {spec.confidence:.0%} bootstrap; constraints judged on the pessimistic bound, "
            "overlapping objective intervals are ties[/dim]"
        )
    _print_load(out, report)
    for target, why in report.plan.skipped_targets.items():
        out.print(f"[yellow]target {target} SKIPPED[/yellow]: {why}")
    for note in report.plan.dropped:
        out.print(f"[dim]note: {note}[/dim]")
    stats = report.stats
    out.print(
        f"passes: {stats.passes_run} run ({stats.pass_seconds:.1f} s), {stats.passes_cached} cached · "
        f"evaluations: {stats.evals_run} run ({stats.eval_seconds:.1f} s), {stats.evals_cached} cached · "
        f"datasets: {stats.datasets_run} read, {stats.datasets_cached} cached · wall {report.wall_s:.1f} s"
    )
    for state, colour, said in (("failed", "red", "failed"), ("inapplicable", "yellow", "inapplicable (a setting the model cannot take)")):
        listed = [r for r in report.results if r.state == state]
        heading = [f"[{colour}]{len(listed)} candidate(s) {said}:[/{colour}]"] if listed else []
        for line in heading + [f"  {r.candidate.id} ({r.label}): {r.reason}" for r in listed]:
            out.print(line)
    chosen = report.chosen()
    _print_across_targets(out, report, chosen, objective, spec.primary.goal)
    for target in report.resolved.targets:
        if target in chosen:
            where = report.output_dir / target / "model" if report.output_dir else "(not written)"
            out.print(f"[bold]chosen for {target}[/bold]: {chosen[target].label} → {where}")
            if chosen[target].verdict:
                out.print(f"  [dim]why: {chosen[target].verdict}[/dim]")
            if len(spec.objectives) > 1:
                front = [f"#{r.candidate.id.split('/')[-1]}" for r in report.results if r.candidate.target == target and r.pareto]
                out.print(f"  Pareto front on {', '.join(o.metric for o in spec.objectives)}: {', '.join(front)}")
            if report.output_dir and (report.output_dir / target / "inference_settings.json").is_file():
                runs_it = " · inference.py opens it that way" if (report.output_dir / target / "inference.py").is_file() else ""
                out.print(f"  [dim]run it as measured: {report.output_dir / target / 'inference_settings.json'}{runs_it}[/dim]")
        elif target not in report.plan.skipped_targets:
            out.print(f"[red]no candidate for {target} completed and met the constraints[/red]")
    if report.output_dir:
        out.print(f"records: {report.output_dir / 'candidates.json'}, {report.output_dir / 'workflow.lock.json'}")
        if (report.output_dir / "report.html").is_file():
            out.print(f"report: {report.output_dir / 'report.html'} (one file: open it in a browser)")


def _print_load(out: Console, report: RunReport) -> None:
    """Say which timings kept rounds taken while other processes kept the machine busy."""
    loaded = [(r, eval_id, noise) for r in report.results for eval_id, noise in under_load(r).items()]
    if not loaded:
        return
    out.print(f"[yellow]{len(loaded)} timing(s) were measured under load[/yellow] (other processes kept the machine busy):")
    for result, eval_id, noise in loaded:
        width = noise.get("interval_half_width")
        spread = f", interval ±{width:.1%}" if isinstance(width, float) else ""
        out.print(
            f"  {result.candidate.id} {eval_id}: others used {noise['others_cores_mean']:.2f} cores on average "
            f"(max {noise['others_cores_max']:.2f}), {noise['busy_rounds_kept']} busy round(s) kept{spread}"
        )


def _print_across_targets(out: Console, report: RunReport, chosen: dict[str, CandidateResult], objective: str, goal: str) -> None:
    """With several targets: the best choice overall, against every target's reference."""
    if len(chosen) < 2:
        return
    sign = 1 if goal == "max" else -1
    best_target, best = max(chosen.items(), key=lambda item: item[1].metrics.get(objective, float("-inf") * sign) * sign)
    value = best.metrics.get(objective)
    if value is None:
        return
    ratios = []
    paired = paired_metric(report.resolved, objective)
    for result in report.results:
        if paired and result.candidate.reference and result.candidate.target == best_target:
            ratios.append(f"{paired_speedup(best, paired)} vs its own reference")  # the paired figure, as in the table
        elif result.candidate.reference and objective in result.metrics and result.metrics[objective]:
            ref = result.metrics[objective]
            apart = ratio_apart(value, best.intervals.get(objective), ref, result.intervals.get(objective), goal)
            ratios.append(f"{apart} vs {result.candidate.target}'s reference ({objective} {_num(ref)})")
    out.print(f"[bold]best across targets[/bold]: {best_target}: {best.label} ({objective} {_num(value)}) · " + ", ".join(ratios))


def ratio_apart(value: float, interval: Interval | None, ref: float, ref_interval: Interval | None, goal: str) -> str:
    """``value`` against ``ref``, measured at different times (no paired rounds to bootstrap): the
    ratio and the bounds the two intervals allow, end against end; without both, the ratio alone."""
    ratio = ref / value if goal == "min" else value / ref
    if interval is None or ref_interval is None or min(interval.low, ref_interval.low) <= 0:
        return f"{number(ratio)}x (timed apart)"
    if goal == "min":
        low, high = ref_interval.low / interval.high, ref_interval.high / interval.low
    else:
        low, high = interval.low / ref_interval.high, interval.high / ref_interval.low
    return f"{number(ratio)}x [{number(low)}, {number(high)}] (timed apart)"


def print_plan(status: PlanStatus, explain_misses: bool = False) -> None:
    search = status.search
    console.print(f"[bold]{status.workflow}[/bold]: input {_input_text(status.input)} · store {status.store}")
    budget = [
        f"max_candidates={search.max_candidates}" if search.max_candidates else None,
        f"max_time_s={search.max_time_s:g}" if search.max_time_s else None,
    ]
    budget_text = ", ".join(b for b in budget if b) or "none (the whole space)"
    console.print(f"search: sampler {search.sampler}, seed {search.seed}, budget {budget_text}")
    for space in status.spaces:
        size = space.size if space.size is not None else "infinitely many (a float range)"
        branches = f"{space.paths} paths, " if space.paths > 1 else ""
        console.print(f"  {space.target}: space of {size} points ({branches}dimensions: {', '.join(space.dimensions) or 'none'})")
    if search.sampler != "grid":
        console.print(f"  [dim]{search.sampler} proposes points as it goes; below is the grid over the same space[/dim]")
    console.print(f"{status.job_count} pass jobs · {status.candidate_count} candidates")
    for target, why in status.skipped_targets.items():
        console.print(f"[yellow]target {target} SKIPPED[/yellow]: {why}")
    for job in status.jobs:
        indent = "  " * job.depth
        if job.state == BLOCKED:
            console.print(f"  {indent}[yellow]MISS[/yellow] {job.label} [dim](its input is not built yet)[/dim]")
            continue
        mark = "[green]HIT [/green]" if job.state == HIT else "[yellow]MISS[/yellow]"
        console.print(f"  {indent}{mark} {job.label} [dim]{(job.key or '')[:12]}[/dim]")
        if explain_misses and job.state == MISS:
            console.print(f"  {indent}     [dim]{_why(job.changed)}[/dim]")
    for target, candidates in status.candidates.items():
        console.print(f"[bold]{target}[/bold]: {len(candidates)} candidates x {status.evaluations} evaluations")
        for candidate in candidates:
            marks = " ".join(
                f"{eval_id}:" + ("[green]HIT[/green]" if state == HIT else "[yellow]MISS[/yellow]")
                for eval_id, state in candidate.evaluations.items()
            )
            ref = " [dim](reference)[/dim]" if candidate.reference else " [dim](baseline)[/dim]" if candidate.baseline else ""
            ref = ref if candidate.measured else " [dim](reference: made, not measured: search.reference is false)[/dim]"
            console.print(f"  {candidate.id.split('/')[-1]:>3} {candidate.label}{ref}  " + marks)
    for note in status.dropped:
        console.print(f"[dim]note: {note}[/dim]")


def _input_text(model: ModelArtifact) -> str:
    """The input as the plan names it: its format and digest; a Hub model's repo and commit too."""
    hub = f"{model.attrs['model']}@{str(model.attrs.get('commit'))[:12]} " if model.attrs.get("model") else ""
    return f"{model.format} {hub}{model.digest[:12] or '(not downloaded yet: every job below is to run)'}"


def _why(changed: tuple[str, ...] | None) -> str:
    if changed is None:
        return "never run before"
    return "changed since the last run: " + (
        ", ".join(changed) if changed else "nothing in the key (its result was removed from the store)"
    )


def print_plugins(kind: str) -> None:
    table = Table(title=kind, title_justify="left")
    table.add_column("name")
    table.add_column("summary", overflow="fold")
    for name in registry.names(kind):
        try:
            cls = registry.load(kind, name)
            summary = cls.summary
        except KilnError as error:
            summary = f"[red]cannot load: {error}[/red]"
        table.add_row(name, summary)
    console.print(table)


def print_plugin(kind: str, cls: Any) -> None:
    name = getattr(cls, "name", None) or getattr(cls, "runtime", "")
    console.print(f"[bold]{name}[/bold] — {cls.summary}")
    for attr in ("accepts", "produces", "target_dependent", "metrics", "timing", "libraries"):
        if hasattr(cls, attr):
            value = getattr(cls, attr)
            console.print(
                f"  {attr}: {', '.join(map(str, value)) if isinstance(value, tuple) else flag(value) if isinstance(value, bool) else value}"
            )
    if getattr(cls, "environment", None) is not None:
        pins = ", ".join(cls.environment.requirements)
        console.print(f"  environment: {pins} (an isolated environment engine run builds once; a step's environment replaces it)")
    if getattr(cls, "keeps", ()):
        console.print(f"  keeps: {', '.join(cls.keeps)} (an input in one of these formats gives an output in the same format)")
    if hasattr(cls, "default_timeout_s"):
        how = "" if kind == "datasources" else " (a step's or evaluation's timeout_s overrides it)"
        console.print(f"  default timeout: {cls.default_timeout_s:g} s{how}")
    table = Table(title="options", title_justify="left")
    for column in ("option", "type", "default", "description"):
        table.add_column(column, overflow="fold")
    for option, info in cls.Config.model_fields.items():
        if option in ("id", "runtime", "source"):
            continue
        annotation = type_text(without_markers(info.annotation))
        default = "required" if info.is_required() else json.dumps(info.get_default(call_default_factory=True), default=str)
        table.add_row(escape(option), escape(annotation), escape(default), escape(info.description or ""))
    console.print(table)
    space = getattr(cls, "search_space", {})
    if space:
        console.print("  searchable (steps may search these options):")
        for key, dimension in space.items():
            console.print(f"    {escape(key)}: {escape(space_text(dimension.to_json()))}")


def print_host_reports(only: str | None = None) -> None:
    """Per runtime family that lists its backends (onnxruntime's execution providers), which
    of them can run on this host and, where not, precisely why."""
    for name in registry.names("targets"):
        if only is not None and name != only:
            continue
        try:
            rows = registry.load("targets", name).host_report()
        except KilnError:
            continue  # print_plugins already said it cannot load
        if not rows:
            continue
        table = Table(title=f"{name}: on this host", title_justify="left")
        for column in ("backend", "here", "why not / provided by"):
            table.add_column(column, overflow="fold")
        for backend, ok, why in rows:
            table.add_row(backend, "[green]yes[/green]" if ok else "[red]no[/red]", why)
        console.print(table)


def print_target_availability(resolved: Any) -> None:
    """Each target a workflow declares: runtime, options that pick the device, and whether it
    runs here (with the reason when not)."""
    table = Table(title=f"targets of {resolved.name}", title_justify="left")
    for column in ("target", "runtime", "device", "here", "why not"):
        table.add_column(column, overflow="fold")
    for target_id, entry in resolved.targets.items():
        config = entry.instance.config
        device = getattr(config, "device", "")
        providers = getattr(config, "providers", None)
        if providers:
            device = f"{device} ({', '.join(providers)})"
        ok = entry.availability.ok
        table.add_row(target_id, entry.cls.runtime, device, "[green]yes[/green]" if ok else "[red]no[/red]", entry.availability.reason)
    console.print(table)
