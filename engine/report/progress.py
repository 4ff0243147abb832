"""The run's progress on a terminal: per target a bar of candidates with an ETA and the counts of
pass jobs (done, running, cached) and evaluations, the job that has run longest so far with its
elapsed time, and the best candidate so far. Quiet runs and pipes keep engine.report.report's lines."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, RenderableType
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from engine.execute.hooks import Hooks, searching_target
from engine.plan.jobs import PassSpec
from engine.select.results import CandidateResult


@dataclass
class _Counts:
    task: TaskID
    total: int | None
    jobs_done: int = 0
    jobs_cached: int = 0
    jobs_failed: int = 0
    evals_done: int = 0
    evals_cached: int = 0
    evals_failed: int = 0
    candidates: int = 0
    started: float = 0.0  # when the target's search began (the progress clock)
    work_s: float = 0.0  # the durations of the jobs and evaluations finished so far
    running: dict[str, float] = field(default_factory=dict)  # job label -> when it started
    evaluating: dict[str, float] = field(default_factory=dict)  # "candidate evaluation" -> when it started

    def shown_total(self) -> int | None:
        """The total shown: never below what is done (an estimate that came out short grows)."""
        return None if self.total is None else max(self.total, self.candidates)

    def left(self) -> str:
        total = self.shown_total()
        return f", {total - self.candidates} left" if total is not None else ""

    def eta(self, now: float) -> float | None:
        """Seconds left: the time per candidate so far times the candidates left. Before the
        first candidate is done, the time it has taken so far (at least its finished jobs' and
        evaluations' durations) stands for one candidate, once one job or evaluation finished.
        None when nothing finished yet or the total is unknown."""
        total = self.shown_total()
        if total is None:
            return None
        left, elapsed = total - self.candidates, max(0.0, now - self.started)
        if self.candidates:
            return elapsed / self.candidates * left
        if self.jobs_done + self.evals_done:
            return max(elapsed, self.work_s) * left
        return None

    def text(self) -> str:
        failed = f", [red]{self.jobs_failed} failed[/red]" if self.jobs_failed else ""
        evals_failed = f", [red]{self.evals_failed} failed[/red]" if self.evals_failed else ""
        return (
            f"jobs {self.jobs_done} done, {len(self.running)} running, {self.jobs_cached} cached{failed} · "
            f"evaluations {self.evals_done} run, {len(self.evaluating)} running, {self.evals_cached} cached{evals_failed}"
        )


class _Eta(ProgressColumn):
    """The ETA of a target from ``LiveProgress.eta`` (rich's own needs two candidates finished
    within its 30 s window, so it stays at -:--:-- while candidates take longer than that)."""

    def __init__(self, eta: Callable[[TaskID], float | None]) -> None:
        super().__init__()
        self.eta = eta

    def render(self, task: Task) -> Text:
        seconds = self.eta(task.id)
        if seconds is None:
            return Text("-:--:--", style="progress.remaining")
        minutes, secs = divmod(round(seconds), 60)
        hours, minutes = divmod(minutes, 60)
        return Text(f"{hours}:{minutes:02d}:{secs:02d}", style="progress.remaining")


class _Bars(Progress):
    """rich's Progress with the current job and the best-so-far lines under the bars."""

    extra: Callable[[], list[RenderableType]] = staticmethod(list)

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        yield from self.extra()


class LiveProgress(Hooks):
    """Live bars for a terminal; ``clock`` is injectable so a test can render fixed times."""

    def __init__(self, console: Console, objective: str, goal: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.console, self.objective, self.goal, self.clock = console, objective, goal, clock
        self.bars = _Bars(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("candidates{task.fields[left]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            _Eta(self.eta),
            console=console,
            get_time=clock,
            refresh_per_second=4,
        )
        self.bars.extra = self.lines
        self.targets: dict[str, _Counts] = {}
        self.current: str | None = None
        self.best: dict[str, CandidateResult] = {}
        self._lock = threading.RLock()

    def __enter__(self) -> LiveProgress:
        self.bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bars.refresh()
        self.bars.stop()

    def _counts(self, target: str | None = None) -> _Counts:
        name = target or searching_target() or self.current or "run"
        if name not in self.targets:
            self.target_started(name, None)
        return self.targets[name]

    def _update(self, counts: _Counts) -> None:
        self.bars.update(counts.task, completed=counts.candidates, total=counts.shown_total(), left=counts.left())

    def eta(self, task: TaskID) -> float | None:
        with self._lock:
            counts = next((c for c in self.targets.values() if c.task == task), None)
            return None if counts is None else counts.eta(self.clock())

    def _say(self, text: str) -> None:
        self.bars.console.print(text)

    def lines(self) -> list[RenderableType]:
        """Per target its counts, the job or evaluation running longest (with its elapsed time), and
        each target's best so far."""
        with self._lock:
            out: list[RenderableType] = [f"  [dim]{target}:[/dim] {counts.text()}" for target, counts in self.targets.items()]
            running = [(t, label) for c in self.targets.values() for label, t in [*c.running.items(), *c.evaluating.items()]]
            if running:
                started, label = min(running)
                more = f" [dim](+{len(running) - 1} more)[/dim]" if len(running) > 1 else ""
                out.append(f"running {escape(label)} for {self.clock() - started:.1f} s{more}")
            for target, result in self.best.items():
                value = result.metrics[self.objective]
                out.append(
                    f"best so far on {target}: {escape(result.label)} ({self.objective} {value:.4g}) [dim](before constraints)[/dim]"
                )
            return out

    def target_started(self, target: str, candidates: int | None) -> None:
        with self._lock:
            self.current = target
            if target not in self.targets:
                task = self.bars.add_task(target, total=candidates, left="")
                self.targets[target] = _Counts(task, candidates, started=self.clock())
            self._update(self.targets[target])

    def model_download_started(self, model: str, commit: str, files: int) -> None:
        self._say(f"downloading {escape(model)} (commit {commit[:12]}, {files} files) from the Hugging Face Hub…")

    def environment_started(self, key: str, requirements: list[str]) -> None:
        self._say(f"building environment {key[:12]} ({', '.join(requirements)})…")

    def dataset_failed(self, name: str, error: str | None) -> None:
        self._say(f"dataset {name}: [red]failed[/red]: {error}")

    def job_cached(self, job: PassSpec) -> None:
        with self._lock:
            counts = self._counts()
            counts.jobs_cached += 1
            self._update(counts)

    def job_started(self, job: PassSpec) -> None:
        with self._lock:
            counts = self._counts()
            counts.running[job.label] = self.clock()
            self._update(counts)

    def _job_end(self, job: PassSpec, field_name: str, seconds: float | None = None) -> None:
        with self._lock:
            counts = next((c for c in self.targets.values() if job.label in c.running), None) or self._counts()
            counts.running.pop(job.label, None)
            counts.work_s += seconds or 0.0
            setattr(counts, field_name, getattr(counts, field_name) + 1)
            self._update(counts)

    def job_done(self, job: PassSpec, status: str, seconds: float | None) -> None:
        self._job_end(job, "jobs_done" if status == "ran" else "jobs_cached", seconds)

    def job_failed(self, job: PassSpec, error: str | None) -> None:
        self._job_end(job, "jobs_failed")
        text = (error or "").strip().splitlines()
        self._say(f"[red]fail[/red]  {escape(job.label)}: {escape(text[0] if text else '')}")

    def eval_started(self, candidate: str, evaluation: str) -> None:
        with self._lock:
            self._counts(_target_of(candidate)).evaluating[f"{candidate} {evaluation}"] = self.clock()

    def eval_cached(self, candidate: str, evaluation: str) -> None:
        self._eval(candidate, "evals_cached")

    def eval_done(self, candidate: str, evaluation: str, status: str, seconds: float | None) -> None:
        self._eval(candidate, "evals_done", evaluation, seconds)

    def _eval(self, candidate: str, field_name: str, evaluation: str = "", seconds: float | None = None) -> None:
        with self._lock:
            counts = self._counts(_target_of(candidate))
            counts.evaluating.pop(f"{candidate} {evaluation}", None)
            counts.work_s += seconds or 0.0
            setattr(counts, field_name, getattr(counts, field_name) + 1)
            self._update(counts)

    def eval_failed(self, candidate: str, evaluation: str, error: str | None) -> None:
        self._eval(candidate, "evals_failed", evaluation)
        text = (error or "").strip().splitlines()
        self._say(f"[red]fail[/red]  {escape(candidate)} {escape(evaluation)}: {escape(text[0] if text else '')}")

    def candidate_done(self, result: CandidateResult, measured: bool) -> None:
        with self._lock:
            counts = self._counts(result.candidate.target)
            counts.candidates += 1
            self._update(counts)
            value = result.metrics.get(self.objective) if result.state == "complete" else None
            if value is not None:
                best = self.best.get(result.candidate.target)
                sign = 1 if self.goal == "max" else -1
                if best is None or value * sign > best.metrics[self.objective] * sign:
                    self.best[result.candidate.target] = result

    def budget_reached(self, target: str, reason: str) -> None:
        self._say(f"[dim]{target}: search stops ({reason})[/dim]")

    def study_opened(self, target: str, study: str, note: str) -> None:
        self._say(f"[dim]{escape(target)}: the search {escape(note)}[/dim]")


def _target_of(candidate: str) -> str | None:
    return candidate.split("/")[0] if "/" in candidate else None


def live_progress(console: Console, resolved: Any) -> LiveProgress:
    objective = resolved.spec.select.primary
    return LiveProgress(console, objective.metric, objective.goal)
