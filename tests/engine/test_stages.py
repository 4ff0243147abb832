"""Staged evaluation (engine.execute.stages): a constrained figure scored row by row is judged on the
first rows, and on every row only when those leave its interval across the bar. The evaluations
are counted through the engine's evaluation loop with a measure that scores rows of known
per-token NLL increases."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import tiny_workflow, write_workflow

from engine.core.artifact import ModelArtifact
from engine.execute.evaluation import candidate_evaluations, evaluate
from engine.execute.stages import FIRST_ROWS
from engine.plan.planner import Candidate
from engine.select.results import CandidateResult
from engine.select.select import cheap_violations
from engine.workflow.resolve import load_workflow

ROWS, TOKENS, BAR = 32, 16, 0.05


def _resolved(tmp_path, tiny_onnx, timed=False, constraint=None, **search):
    workflow = tiny_workflow(tiny_onnx, search=search)
    timing = [e for e in workflow["evaluate"] if e["id"] == "latency"] if timed else []
    workflow["evaluate"] = [
        *timing,
        {"id": "perplexity", "evaluator": "perplexity", "config": {"data": "rows"}},
        {"id": "size", "evaluator": "size"},
    ]
    workflow["select"] = {
        "objective": {"metric": "size.file_bytes", "goal": "min"},
        "constraints": [constraint or {"metric": "perplexity.nll_increase", "max": BAR}],
    }
    return load_workflow(write_workflow(tmp_path, workflow))


class Rows:
    """A candidate whose row r raises the NLL by ``means[r]`` per token (plus seeded noise); counts the rows scored."""

    def __init__(self, means: np.ndarray) -> None:
        self.means, self.scored, self.looks, self.measured = means, 0, [], []

    def __call__(self, spec, reference):
        self.measured.append(spec.id)
        if spec.id == "latency":
            return {"values": {"p50_ms": 1.0}}, None
        if spec.id != "perplexity":
            return {"values": {"file_bytes": 1.0}}, None
        rows = ROWS if spec.config.get("limit") is None else min(ROWS, spec.config["limit"])
        self.scored += rows
        self.looks.append(rows)
        noise = np.random.default_rng(0).normal(0, 0.01, size=(ROWS, TOKENS))
        diffs = (self.means[:, None] + noise)[:rows]
        values = diffs.ravel().tolist()
        groups = [r for r in range(rows) for _ in range(TOKENS)]
        record = {
            "values": {"nll_increase": float(np.mean(values))},
            "samples": {"nll_increase": {"statistic": "mean", "values": values, "groups": groups}},
        }
        return record | {"details": {"rows": rows}}, None


def _run(resolved, means, tiny_onnx):
    result = CandidateResult(candidate=Candidate(id="cpu/1", target="cpu", jobs=("j",), params={}), label="c1")
    reference = CandidateResult(
        candidate=Candidate(id="cpu/0", target="cpu", jobs=(), params={}, reference=True), label="ref", state="complete"
    )
    reference.model = ModelArtifact.from_folder("onnx", tiny_onnx.parent)
    measure = Rows(np.asarray(means, dtype=float))
    evaluate(resolved, candidate_evaluations(resolved), result, reference, _NoData(), measure)
    assert result.state != "failed", result.reason
    return result, measure, reference


class _NoData:
    def unreadable(self, names):
        return None


@pytest.mark.parametrize(
    ("means", "looks", "feasible"),
    [
        ([1.0] * ROWS, [FIRST_ROWS], False),  # far outside the bar: rejected on the first rows
        ([0.0] * ROWS, [FIRST_ROWS], True),  # far inside: accepted on the first rows
        ([0.02, 0.07] * (ROWS // 2), [FIRST_ROWS, ROWS], False),  # near it (mean 0.045, rows apart): every row decides
        ([0.02, 0.06] * (ROWS // 2), [FIRST_ROWS, ROWS], True),  # near it, inside: every row decides
    ],
)
def test_only_a_candidate_near_the_bar_is_judged_on_every_row_and_as_without_stages(tmp_path, tiny_onnx, means, looks, feasible):
    staged = _resolved(tmp_path / "staged", tiny_onnx)
    whole = _resolved(tmp_path / "whole", tiny_onnx, staged=False)
    result, measure, reference = _run(staged, means, tiny_onnx)
    assert measure.looks == looks
    assert measure.scored == sum(looks)
    assert result.details["perplexity"]["stage"]
    assert (not cheap_violations(staged, result, reference)) is feasible
    unstaged, every_row, reference = _run(whole, means, tiny_onnx)
    assert every_row.looks == [ROWS]
    assert (not cheap_violations(whole, unstaged, reference)) is feasible  # the same verdict as judging every row


def test_a_near_candidate_breaking_the_bar_on_every_row_is_rejected_as_without_stages(tmp_path, tiny_onnx):
    staged = _resolved(tmp_path / "staged", tiny_onnx)
    whole = _resolved(tmp_path / "whole", tiny_onnx, staged=False)
    means = [0.05] * ROWS
    a, looks_a, ref_a = _run(staged, means, tiny_onnx)
    b, looks_b, ref_b = _run(whole, means, tiny_onnx)
    assert looks_a.looks == [FIRST_ROWS, ROWS] and looks_b.looks == [ROWS]
    assert cheap_violations(staged, a, ref_a) and cheap_violations(whole, b, ref_b)
    assert a.metrics == b.metrics


def test_the_reference_is_staged_under_an_absolute_bar_and_measured_on_every_row_under_a_drop(tmp_path, tiny_onnx):
    """nll_increase <= bar is paired row by row inside the evaluator: the reference (increase 0)
    meets it on the first rows. A drop from the reference's figure needs that figure on every row."""
    absolute = _resolved(tmp_path / "absolute", tiny_onnx)
    reference = CandidateResult(candidate=Candidate(id="cpu/0", target="cpu", jobs=(), params={}, reference=True), label="ref")
    measure = Rows(np.zeros(ROWS))
    evaluate(absolute, candidate_evaluations(absolute), reference, None, _NoData(), measure)
    assert measure.looks == [FIRST_ROWS]
    assert reference.details["perplexity"]["stage"].startswith("meets the constraints on the first")
    relative = _resolved(tmp_path / "relative", tiny_onnx, constraint={"metric": "perplexity.nll_increase", "max_drop": 0.05})
    reference = CandidateResult(candidate=Candidate(id="cpu/0", target="cpu", jobs=(), params={}, reference=True), label="ref")
    measure = Rows(np.zeros(ROWS))
    evaluate(relative, candidate_evaluations(relative), reference, None, _NoData(), measure)
    assert measure.looks == [ROWS]


def test_a_candidate_rejected_on_the_first_rows_is_never_timed(tmp_path, tiny_onnx):
    resolved = _resolved(tmp_path, tiny_onnx, timed=True)
    assert [spec.id for spec in candidate_evaluations(resolved)] == ["perplexity", "size", "latency"]  # timing last
    far, measure, _ = _run(resolved, [1.0] * ROWS, tiny_onnx)
    assert measure.measured == ["perplexity"] and far.untimed and far.violations
    near, measure, _ = _run(resolved, [0.0] * ROWS, tiny_onnx)
    assert measure.measured == ["perplexity", "size", "latency"] and not near.untimed


def test_staging_does_not_name_the_searchs_study(tmp_path, tiny_onnx):
    """Turning the staged bar off (to check a staged run's choice) continues the same search."""
    from engine.search.studies import identity

    staged, whole = _resolved(tmp_path / "a", tiny_onnx), _resolved(tmp_path / "b", tiny_onnx, staged=False)
    assert "staged" not in identity(staged.spec)["search"]
    assert identity(staged.spec) == identity(whole.spec)
