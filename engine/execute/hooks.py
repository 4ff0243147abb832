"""What a run tells its observers: typed hooks before, after and on the failure of each dataset
read, pass job and evaluation, plus the search's progress. ``Hooks`` does nothing; an observer
overrides what it needs (the terminal progress in engine.report.report, ``EventLog`` for events.jsonl,
``Tally`` for the run report's counts) and ``Fanout`` passes every call to several observers."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from engine.execute.outdir import is_partial_event_log
from engine.plan.jobs import PassSpec
from engine.select.results import CandidateResult, Stats

#: the target whose search the calling thread works for: engine.search sets it in each target's
#: threads, since the targets are searched at once and a hook on a job does not name its target
_searching = threading.local()


def searching_target() -> str | None:
    """The target the calling thread searches for (None: no target search's thread)."""
    return getattr(_searching, "target", None)


def set_searching_target(target: str | None) -> None:
    _searching.target = target


class Hooks:
    def model_download_started(self, model: str, commit: str, files: int) -> None:
        """The input, a Hugging Face Hub model the cache lacks, is being downloaded (``files``: how many)."""

    def model_download_done(self, model: str, commit: str, seconds: float) -> None:
        """The input model was downloaded into the Hugging Face cache."""

    def environment_started(self, key: str, requirements: list[str]) -> None:
        """A virtual environment a target or step needs is being built (engine.execute.environments)."""

    def environment_done(self, key: str, seconds: float) -> None:
        """A virtual environment was built."""

    def dataset_started(self, name: str) -> None:
        """A dataset the store does not have is being read."""

    def dataset_done(self, name: str, status: str, samples: int | None) -> None:
        """A dataset is ready: read now (``ran``), found in the store (``hit``) or read meanwhile by
        another run sharing the store (``shared``)."""

    def dataset_failed(self, name: str, error: str | None) -> None:
        """A dataset could not be read."""

    def job_cached(self, job: PassSpec) -> None:
        """A pass job's result was found in the store."""

    def job_started(self, job: PassSpec) -> None:
        """A pass job is handed to a worker."""

    def job_done(self, job: PassSpec, status: str, seconds: float | None) -> None:
        """A pass job finished: ``ran``, or ``hit`` when another run built it meanwhile."""

    def job_failed(self, job: PassSpec, error: str | None) -> None:
        """A pass job failed."""

    def job_placed(self, job: PassSpec, node: dict[str, Any]) -> None:
        """Where the job ran (``Outcome.node``: the node's id, label, host, began, ended), before its end."""

    def eval_started(self, candidate: str, evaluation: str) -> None:
        """An evaluation of a candidate is handed to a worker."""

    def eval_cached(self, candidate: str, evaluation: str) -> None:
        """An evaluation's result was found in the store."""

    def eval_done(self, candidate: str, evaluation: str, status: str, seconds: float | None) -> None:
        """An evaluation finished: ``ran``, or ``shared`` when another run measured it meanwhile."""

    def eval_failed(self, candidate: str, evaluation: str, error: str | None) -> None:
        """An evaluation failed."""

    def eval_placed(self, candidate: str, evaluation: str, node: dict[str, Any]) -> None:
        """Where the evaluation ran, before its end."""

    def candidate_done(self, result: CandidateResult, measured: bool) -> None:
        """A candidate is complete, failed or pruned (``measured``: it reached its evaluations)."""

    def target_started(self, target: str, candidates: int | None) -> None:
        """The search of a target begins; ``candidates``: how many it expects to process at most
        (None: unknown, e.g. a float range without ``search.max_candidates``)."""

    def budget_reached(self, target: str, reason: str) -> None:
        """The search of a target stops before its space is exhausted."""

    def study_opened(self, target: str, study: str, note: str) -> None:
        """A target's sampler opened its study: ``note`` says whether it continues one or is new
        (and then what changed since the last one of the workflow)."""


class Fanout(Hooks):
    """Every hook call, passed to each of ``observers`` in turn."""

    def __init__(self, *observers: Hooks) -> None:
        self.observers = observers


def _fanned(name: str) -> Any:
    def call(self: Fanout, *args: Any, **kwargs: Any) -> None:
        for observer in self.observers:
            getattr(observer, name)(*args, **kwargs)

    call.__name__ = name
    return call


for _name in [n for n in vars(Hooks) if not n.startswith("_")]:
    setattr(Fanout, _name, _fanned(_name))


class Tally(Hooks):
    """Counts into ``stats`` what ran and what came from the store (the run report's figures)."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self._lock = threading.Lock()

    def _count(self, kind: str, status: str, seconds: float | None = None) -> None:
        with self._lock:
            self.stats.count(kind, status, float(seconds or 0.0))

    def dataset_done(self, name: str, status: str, samples: int | None) -> None:
        self._count("datasets", status)

    def job_cached(self, job: PassSpec) -> None:
        self._count("passes", "hit")

    def job_done(self, job: PassSpec, status: str, seconds: float | None) -> None:
        self._count("passes", "ran" if status == "ran" else "shared", seconds)

    def eval_cached(self, candidate: str, evaluation: str) -> None:
        self._count("evals", "hit")

    def eval_done(self, candidate: str, evaluation: str, status: str, seconds: float | None) -> None:
        self._count("evals", status, seconds)


class EventLog(Hooks):
    """Writes each hook call of one run as one JSON line to ``events.jsonl``: this run's events
    only. They go to a new file beside it (``.events.jsonl.<id>.tmp``, flushed line by line, so a
    run in progress can be followed there), which replaces ``events.jsonl`` in one rename when
    the run ends, interrupted or not: the previous run's log stays whole until then."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        self.handle: Any = None

    def __enter__(self) -> EventLog:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(self.partial, "x", encoding="utf-8")
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.close()
        os.replace(self.partial, self.path)
        for left in self.path.parent.iterdir():  # logs of runs killed before they ended
            if is_partial_event_log(left.name):
                left.unlink(missing_ok=True)

    def write(self, kind: str, **fields: Any) -> None:
        self.handle.write(json.dumps({"t": round(time.time(), 3), "event": kind, **fields}, default=str) + "\n")
        self.handle.flush()

    def model_download_started(self, model: str, commit: str, files: int) -> None:
        self.write("model_download_started", model=model, commit=commit, files=files)

    def model_download_done(self, model: str, commit: str, seconds: float) -> None:
        self.write("model_download_done", model=model, commit=commit, seconds=round(seconds, 3))

    def environment_started(self, key: str, requirements: list[str]) -> None:
        self.write("environment_started", environment=key, requirements=list(requirements))

    def environment_done(self, key: str, seconds: float) -> None:
        self.write("environment_done", environment=key, seconds=round(seconds, 3))

    def dataset_started(self, name: str) -> None:
        self.write("dataset_start", name=name)

    def dataset_done(self, name: str, status: str, samples: int | None) -> None:
        self.write("dataset_end", name=name, ok=True, samples=samples)

    def dataset_failed(self, name: str, error: str | None) -> None:
        self.write("dataset_end", name=name, ok=False, error=error)

    def job_cached(self, job: PassSpec) -> None:
        self.write("job_end", job=job.label, status="hit")

    def job_started(self, job: PassSpec) -> None:
        self.write("job_start", job=job.label)

    def job_done(self, job: PassSpec, status: str, seconds: float | None) -> None:
        self.write("job_end", job=job.label, status=status, seconds=seconds)

    def job_failed(self, job: PassSpec, error: str | None) -> None:
        self.write("job_end", job=job.label, status="failed", error=error)

    def job_placed(self, job: PassSpec, node: dict[str, Any]) -> None:
        self.write("job_node", job=job.label, node=node)

    def eval_started(self, candidate: str, evaluation: str) -> None:
        self.write("eval_start", candidate=candidate, evaluation=evaluation)

    def eval_done(self, candidate: str, evaluation: str, status: str, seconds: float | None) -> None:
        self.write("eval_end", candidate=candidate, evaluation=evaluation, ok=True)

    def eval_failed(self, candidate: str, evaluation: str, error: str | None) -> None:
        self.write("eval_end", candidate=candidate, evaluation=evaluation, ok=False, error=error)

    def eval_placed(self, candidate: str, evaluation: str, node: dict[str, Any]) -> None:
        self.write("eval_node", candidate=candidate, evaluation=evaluation, node=node)

    def candidate_done(self, result: CandidateResult, measured: bool) -> None:
        metrics = {"metrics": result.metrics} if measured else {}
        self.write("candidate_end", candidate=result.candidate.id, state=result.state, reason=result.reason, **metrics)

    def budget_reached(self, target: str, reason: str) -> None:
        self.write("budget", target=target, reason=reason)

    def study_opened(self, target: str, study: str, note: str) -> None:
        self.write("study", target=target, study=study, note=note)
