"""What a run produced: job states, candidate results, counts. Plain data, no behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from engine.core.artifact import ModelArtifact
from engine.core.stats import Interval
from engine.plan.planner import Candidate, Plan
from engine.store.store import Store
from engine.workflow.resolve import ResolvedWorkflow


class JobStatus(StrEnum):
    """How a pass job ended in this run (a str: records and events hold the value)."""

    PENDING = "pending"
    HIT = "hit"  # served from the store
    RAN = "ran"
    FAILED = "failed"
    SKIPPED = "skipped"  # its input failed


class CandidateState(StrEnum):
    """How a candidate ended (a str: candidates.json and events hold the value; the values are
    also those of engine.core.search.TrialState, what the sampler is told)."""

    PENDING = "pending"
    COMPLETE = "complete"
    FAILED = "failed"
    PRUNED = "pruned"
    #: a searched session setting cannot apply to the model on its target (engine.core.errors.
    #: SettingInapplicable): not tried, not a failure of the run; a sampler is told PRUNED
    INAPPLICABLE = "inapplicable"


@dataclass
class JobState:
    job_id: str
    key: str | None = None
    status: JobStatus = JobStatus.PENDING
    artifact: ModelArtifact | None = None
    record: dict[str, Any] | None = None
    error: str | None = None
    candidate: str | None = None  # the candidate that first needed (and so ran) this job
    node: dict[str, Any] | None = None  # where it ran: the node's id, label, host, began, ended


@dataclass
class CandidateResult:
    candidate: Candidate
    label: str
    state: CandidateState = CandidateState.PENDING
    reason: str | None = None
    model: ModelArtifact | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    eval_keys: dict[str, str] = field(default_factory=dict)
    eval_nodes: dict[str, dict[str, Any]] = field(default_factory=dict)  # where each evaluation ran
    feasible: bool | None = None
    violations: list[str] = field(default_factory=list)
    chosen: bool = False
    pareto: bool = False
    untimed: bool = False  # a cheap metric already broke a constraint, so timing was skipped
    #: per-sample figures behind metrics, by metric name: {"statistic": "mean", "values": [...]}
    samples: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: intervals of metrics at the workflow's confidence, by metric name (filled by selection)
    intervals: dict[str, Interval] = field(default_factory=dict)
    #: why this candidate was chosen, or lost to the chosen one (filled by selection)
    verdict: str | None = None
    #: candidates whose objective could not be told apart from this one's (filled for the chosen)
    tied_with: list[str] = field(default_factory=list)
    #: runoffs with the candidates it was tied with, by the other's id: this one's speed over the
    #: other's, paired ({estimate, low, high, confidence, metric, key, ...}; engine.execute.runoff)
    runoffs: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Stats:
    passes_run: int = 0
    passes_cached: int = 0
    evals_run: int = 0
    evals_cached: int = 0
    datasets_run: int = 0
    datasets_cached: int = 0
    pass_seconds: float = 0.0
    eval_seconds: float = 0.0

    def count(self, kind: str, status: str, seconds: float = 0.0) -> None:
        """One of ``kind`` (passes, evals, datasets) done: ``ran`` here, else found in the store
        (``hit``) or built meanwhile by another run sharing it (``shared``)."""
        if status != "ran":
            setattr(self, f"{kind}_cached", getattr(self, f"{kind}_cached") + 1)
            return
        setattr(self, f"{kind}_run", getattr(self, f"{kind}_run") + 1)
        if kind == "passes":
            self.pass_seconds += seconds
        elif kind == "evals":
            self.eval_seconds += seconds


@dataclass
class RunReport:
    resolved: ResolvedWorkflow
    plan: Plan
    store: Store
    input: ModelArtifact
    datasets: dict[str, str]  # name -> dataset key
    jobs: dict[str, JobState]
    results: list[CandidateResult]
    stats: Stats
    wall_s: float = 0.0
    output_dir: Path | None = None

    def chosen(self) -> dict[str, CandidateResult]:
        return {r.candidate.target: r for r in self.results if r.chosen}
