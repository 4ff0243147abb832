"""The runoff on a tiny real ONNX model: the candidates tied on the timing objective are timed
again, paired, in real worker processes; the runoff is an evaluation job like the others (keyed,
stored, counted), and a re-run reuses it and chooses the same bytes."""

from __future__ import annotations

import json

import pytest
from engine_helpers import tiny_workflow, write_workflow

from engine.execute.runner import Runner
from engine.execute.runoff import run_runoffs
from engine.run import run_workflow
from engine.search.search import search
from engine.store.store import Store
from engine.workflow import load_workflow


def _workflow(tmp_path, tiny_onnx, runoff):  # type: ignore[no-untyped-def]
    workflow = tiny_workflow(tiny_onnx)
    # every timed candidate tied with the best (a margin of 99%), so the best is run off against each;
    # a timing is not ended as equivalent within that margin (stop_when_within), so its interval narrows
    workflow["select"] = {**workflow["select"], "tie_within": 0.99, "runoff": runoff}
    next(e for e in workflow["evaluate"] if e["id"] == "latency")["config"]["stop_when_within"] = 1e-6
    return load_workflow(write_workflow(tmp_path, workflow))


def test_the_tied_leaders_are_run_off_and_a_rerun_reuses_it(tmp_path, tiny_onnx) -> None:
    resolved = _workflow(tmp_path, tiny_onnx, {"max_time_s": 5, "precision": 0.05})
    store = Store(tmp_path / "store")
    first = run_workflow(resolved, store)
    complete = [r for r in first.results if r.state == "complete" and r.feasible]
    assert len(complete) == 3  # the reference and two INT8 models
    best = max(complete, key=lambda r: r.metrics["latency.speedup"])
    others = [r for r in complete if r is not best]
    assert sorted(best.runoffs) == sorted(r.candidate.id for r in others)
    # a pair is run off unless one side's own timing against the (tied) reference already
    # decided it: then that timing is the pair's runoff, and no job runs for it
    ran = [o for o in others if "from" not in best.runoffs[o.candidate.id]]
    assert first.stats.evals_run == 6 + len(ran)  # each runoff one evaluation job
    for other in others:
        mine, theirs = best.runoffs[other.candidate.id], other.runoffs[best.candidate.id]
        assert mine["metric"] == "latency.speedup" and mine["status"] == ("ran" if other in ran else "hit")
        assert mine["low"] <= mine["estimate"] <= mine["high"]
        assert theirs["estimate"] == pytest.approx(1 / mine["estimate"], rel=1e-12) and theirs["key"] == mine["key"]
        record = store.lookup(mine["key"])  # stored like any evaluation
        assert record is not None and "speedup" in record["values"]
        if other in ran:
            assert record["values"]["speedup"] == mine["estimate"]
        else:  # the non-reference side's own timing, wholly on one side of 1 or within the 99% margin (equivalent)
            assert best.candidate.reference or other.candidate.reference
            assert mine["from"] == "its timing"
            assert not mine["low"] <= 1 <= mine["high"] or (mine["within"] == 0.99 and 1 / 1.99 <= mine["low"] and mine["high"] <= 1.99)
    chosen = next(r for r in first.results if r.chosen)
    assert "runoff" in chosen.verdict, chosen.verdict
    second = run_workflow(resolved, store)
    assert second.stats.evals_run == 0 and second.stats.evals_cached == 6 + len(ran)
    again = {r.candidate.id: r for r in second.results}
    assert all(again[best.candidate.id].runoffs[o.candidate.id]["status"] == "hit" for o in others)
    assert next(r for r in second.results if r.chosen).model.digest == chosen.model.digest
    assert [r.verdict for r in second.results] == [r.verdict for r in first.results]


def test_the_runoff_is_keyed_by_its_settings_and_can_be_turned_off(tmp_path, tiny_onnx) -> None:
    off = _workflow(tmp_path / "off", tiny_onnx, False)
    report = run_workflow(off, Store(tmp_path / "store"))
    assert report.stats.evals_run == 6 and not any(r.runoffs for r in report.results)
    # the same store, the runoff on: the first measurements are reused, only the runoffs run
    on = _workflow(tmp_path / "on", tiny_onnx, {"max_time_s": 3, "precision": 0.2})
    runner = Runner(on, Store(tmp_path / "store"))
    try:
        runner.materialize_datasets()
        search(runner)
        runner.datasets_done()
        assert runner.stats.evals_run == 0
        measured = run_runoffs(runner)
        assert measured == runner.stats.evals_run
    finally:
        runner.executor.close()
    keys = {r["key"] for result in runner.results.values() for r in result.runoffs.values() if "from" not in r}
    assert len(keys) == measured
    docs = [json.dumps(runner.store.lookup(key) or {}) for key in keys]
    assert all('"speedup"' in doc for doc in docs)


def test_the_runoff_reads_the_paired_ratio_even_when_another_candidate_lacks_it(tmp_path, tiny_onnx) -> None:
    """A candidate that failed (no speedup) made the ranking metric of all results fall back to
    p50_ms, and a runoff stored a pair's milliseconds as its ratio ("won the runoff: 140x")."""
    import dataclasses

    from test_select import resolved_with, result, spread

    from engine.execute.runner import Fetched
    from engine.select.results import CandidateResult, CandidateState

    resolved = resolved_with(tmp_path, tiny_onnx, runoff=True)
    ref = result(tmp_path, 0, speedup=[1.0], cosines=[1.0] * 32, reference=True, passes=0)
    a = result(tmp_path, 1, speedup=spread(1.52, 0.06, seed=1), cosines=[0.995] * 32)
    b = result(tmp_path, 2, speedup=spread(1.50, 0.06, seed=2), cosines=[0.995] * 32)
    failed = CandidateResult(candidate=dataclasses.replace(a.candidate, id="cpu/3"), label="c3", state=CandidateState.FAILED)
    results = [ref, a, b, failed]
    record = {"values": {"speedup": 1.03, "speedup_low": 0.99, "speedup_high": 1.07, "p50_ms": 140.0, "rounds": 12.0}, "samples": {}}
    asked = []

    def measure_pair(spec, first, second):  # type: ignore[no-untyped-def]
        asked.append((spec.id, spec.config["max_time_s"], first.candidate.id, second.candidate.id))
        return Fetched("ran", record), "k"

    assert run_runoffs(_runner(resolved, results, measure_pair)) == 1
    assert asked == [("latency", 30.0, "cpu/1", "cpu/2")]
    assert a.runoffs["cpu/2"]["estimate"] == 1.03 and a.runoffs["cpu/2"]["metric"] == "latency.speedup"
    assert b.runoffs["cpu/1"]["estimate"] == 1 / 1.03


def test_a_candidate_its_own_timing_put_behind_the_tied_reference_is_out_without_a_runoff(tmp_path, tiny_onnx) -> None:
    """Tied with the leader only by tie_within, a candidate whose own paired timing put it below the
    reference (also tied) cannot be chosen: no runoff is spent on it, and the verdict says why."""
    from test_select import resolved_with, result, spread

    from engine.execute.runner import Fetched
    from engine.select.select import select

    resolved = resolved_with(tmp_path, tiny_onnx, runoff=True, tie_within=0.15)
    ref = result(tmp_path, 0, speedup=[1.0], cosines=[1.0] * 32, reference=True, passes=0)
    leader = result(tmp_path, 1, speedup=spread(1.01, 0.08, seed=1), cosines=[0.995] * 32)  # its interval holds 1
    slower = result(tmp_path, 2, speedup=spread(0.90, 0.03, seed=2), cosines=[0.995] * 32, size=10)
    asked = []
    record = {"values": {"speedup": 1.01, "speedup_low": 0.98, "speedup_high": 1.04}, "samples": {}}

    def measure_pair(spec, first, second):  # type: ignore[no-untyped-def]
        asked.append((first.candidate.id, second.candidate.id))
        return Fetched("ran", record), "k"

    results = [ref, leader, slower]
    # nor against the reference: the leader's own timing, holding 1, lies within the 15% margin (equivalent)
    assert run_runoffs(_runner(resolved, results, measure_pair)) == 0
    assert asked == [] and leader.runoffs["cpu/0"]["within"] == 0.15
    assert slower.runoffs["cpu/0"]["from"] == "its timing" and slower.runoffs["cpu/0"]["high"] < 1
    select(resolved, results)
    assert not slower.chosen  # ten times smaller, but measured slower than the reference, paired
    assert "lost on the runoff (#0 " in slower.verdict and "as fast as #2, paired" in slower.verdict, slower.verdict


def test_a_timing_against_the_reference_within_the_tie_margin_is_not_run_off(tmp_path, tiny_onnx) -> None:
    """Paired against the tied reference, wholly within tie_within: equivalent; no runoff, and the
    estimates' difference, immaterial, decides nothing: the simpler pipeline wins."""
    from test_select import resolved_with, result, spread

    from engine.execute.runner import Fetched
    from engine.select.select import select

    asked = []

    def measure_pair(spec, first, second):  # type: ignore[no-untyped-def]
        asked.append((first.candidate.id, second.candidate.id))
        return Fetched("ran", {"values": {"speedup": 0.99, "speedup_low": 0.96, "speedup_high": 1.02}, "samples": {}}), "k"

    # 0.993x [0.971, 1.004] and 1.008x [0.993, 1.039]: within 10% of the reference, not within 1%
    for margin, (center, width, seed) in [(m, s) for m in (0.1, 0.01) for s in ((1.0, 0.04, 3), (1.0, 0.05, 4))]:
        folder = tmp_path / f"{margin}-{seed}"
        resolved = resolved_with(folder, tiny_onnx, runoff=True, tie_within=margin)
        ref = result(folder, 0, speedup=[1.0], cosines=[1.0] * 32, reference=True, passes=0)
        twin = result(folder, 1, speedup=spread(center, width, seed=seed), cosines=[1.0] * 32)
        asked.clear()
        runoffs = 0 if margin == 0.1 else 1
        assert run_runoffs(_runner(resolved, [ref, twin], measure_pair)) == runoffs == len(asked)
        if runoffs:
            continue
        kept = twin.runoffs["cpu/0"]
        assert kept["from"] == "its timing" and kept["within"] == margin and kept["low"] <= 1 <= kept["high"]
        select(resolved, [ref, twin])
        assert ref.chosen and not twin.chosen, seed  # whichever estimate is the higher
        assert "lost on fewer passes (0 vs 1): equivalent on latency.speedup" in twin.verdict, twin.verdict
        assert "lying within the 10% tie margin" in twin.verdict


def test_one_model_made_by_two_paths_is_not_run_off_against_itself(tmp_path, tiny_onnx) -> None:
    from test_select import resolved_with, result, spread

    from engine.execute.runner import Fetched

    resolved = resolved_with(tmp_path, tiny_onnx, runoff=True, tie_within=0.15)
    ref = result(tmp_path, 0, speedup=[1.0], cosines=[1.0] * 32, reference=True, passes=0)
    leader = result(tmp_path, 1, speedup=spread(1.30, 0.05, seed=1), cosines=[0.995] * 32)
    twin = result(tmp_path, 2, speedup=spread(1.29, 0.05, seed=2), cosines=[0.995] * 32)
    twin.model = leader.model  # the same bytes, made by another step
    asked = []

    def measure_pair(spec, first, second):  # type: ignore[no-untyped-def]
        asked.append((first.candidate.id, second.candidate.id))
        return Fetched("ran", {"values": {"speedup": 1.0, "speedup_low": 0.99, "speedup_high": 1.01}, "samples": {}}), "k"

    assert run_runoffs(_runner(resolved, [ref, leader, twin], measure_pair)) == 0
    assert asked == [] and not leader.runoffs and not twin.runoffs
    twin.model = result(tmp_path, 3, speedup=[1.0], cosines=[1.0]).model  # other bytes: run off
    assert run_runoffs(_runner(resolved, [ref, leader, twin], measure_pair)) == 1
    assert asked == [("cpu/1", "cpu/2")]


def _runner(resolved, results, measure_pair):  # type: ignore[no-untyped-def]
    """What run_runoffs reads of a Runner, over results made by hand (the first is the reference)."""
    from types import SimpleNamespace

    from engine.execute.evaluation import candidate_evaluations

    return SimpleNamespace(
        resolved=resolved,
        results={r.candidate.id: r for r in results},
        plan=SimpleNamespace(candidates=[r.candidate for r in results]),
        evaluations=candidate_evaluations(resolved),
        measure_pair=measure_pair,
        references={"cpu": results[0]},
    )
