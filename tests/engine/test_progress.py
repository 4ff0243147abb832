"""Progress on a terminal (rich bars with counts, ETA, the running job and the best so far) on a
forced-terminal console with a fake clock; line mode and events.jsonl unchanged."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest
from rich.console import Console

from engine.execute.hooks import EventLog
from engine.plan.jobs import PassSpec
from engine.report.progress import LiveProgress
from engine.report.report import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _job(label: str) -> PassSpec:
    return PassSpec(job_id=label, step_id="int8", label=label, pass_name="ort_quantize", pass_cls=None, config={})


def _result(target: str, index: int, latency: float, state: str = "complete") -> SimpleNamespace:
    candidate = SimpleNamespace(id=f"{target}/{index}", target=target)
    return SimpleNamespace(candidate=candidate, label=f"int8(per_channel={index})", state=state, metrics={"latency.p50_ms": latency})


def _render(progress: LiveProgress) -> str:
    console = Console(file=io.StringIO(), force_terminal=True, width=200, color_system=None)
    for renderable in progress.bars.get_renderables():
        console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_live_progress_shows_counts_eta_running_job_and_best_so_far():
    clock = Clock()
    console = Console(file=io.StringIO(), force_terminal=True, width=200, color_system=None)
    progress = LiveProgress(console, "latency.p50_ms", "min", clock=clock)
    progress.target_started("cpu", 4)
    progress.job_cached(_job("export"))
    progress.job_started(_job("int8 a"))
    clock.now += 2.0
    progress.job_done(_job("int8 a"), "ran", 2.0)
    progress.eval_done("cpu/0", "latency", "ran", 1.0)
    progress.eval_cached("cpu/0", "fidelity")
    progress.candidate_done(_result("cpu", 0, 5.0), measured=True)  # type: ignore[arg-type]
    clock.now += 2.0
    progress.candidate_done(_result("cpu", 1, 3.5), measured=True)  # type: ignore[arg-type]
    progress.candidate_done(_result("cpu", 2, 1.0, state="failed"), measured=False)  # type: ignore[arg-type]
    progress.job_started(_job("int8 b"))
    clock.now += 7.5
    out = _render(progress)
    assert "cpu" in out and "3/4" in out
    assert "jobs 1 done, 1 running, 1 cached" in out and "evaluations 1 run, 0 running, 1 cached" in out
    assert "3/4 candidates, 1 left" in out and "ETA" in out and "0:00:" in out  # 3 of 4 in 11.5 s: a few seconds left
    assert "running int8 b for 7.5 s" in out
    progress.eval_started("cpu/3", "latency")
    clock.now += 1.0
    assert "running int8 b for 8.5 s (+1 more)" in _render(progress)
    progress.eval_failed("cpu/3", "latency", "no session")
    assert "1 failed" in _render(progress) and "+1 more" not in _render(progress)
    assert "best so far on cpu: int8(per_channel=1) (latency.p50_ms 3.5)" in out  # the failed one does not count
    progress.job_failed(_job("int8 b"), "boom\ntrace")
    assert "fail  int8 b: boom" in console.file.getvalue()  # type: ignore[attr-defined]
    assert "running int8" not in _render(progress) and "0 running, 1 cached, 1 failed" in _render(progress)


def test_line_mode_and_events_are_unchanged_by_the_new_hook(tmp_path, monkeypatch):
    import engine.report.report

    buffer = io.StringIO()
    monkeypatch.setattr(engine.report.report, "console", Console(file=buffer, width=180, highlight=False, color_system=None))
    lines = Progress(quiet=False)
    lines.target_started("cpu", 3)
    lines.job_started(_job("int8 a"))
    lines.job_done(_job("int8 a"), "ran", 1.5)
    printed = [line.split("s ", 1)[1] for line in buffer.getvalue().splitlines()]
    assert printed == ["run   int8 a", "done  int8 a (1.5 s)"]
    with EventLog(tmp_path / "events.jsonl") as events:
        events.target_started("cpu", 3)
        events.job_started(_job("int8 a"))
    assert [json.loads(line)["event"] for line in (tmp_path / "events.jsonl").read_text().splitlines()] == ["job_start"]


def test_a_run_announces_each_target_with_the_candidates_it_processes(tmp_path, tiny_onnx):
    from engine_helpers import tiny_workflow, write_workflow

    from engine.execute.hooks import Hooks
    from engine.run import run_workflow
    from engine.store.store import Store
    from engine.workflow import load_workflow

    class Record(Hooks):
        def __init__(self) -> None:
            self.started: list[tuple[str, int | None]] = []
            self.done = 0

        def target_started(self, target: str, candidates: int | None) -> None:
            self.started.append((target, candidates))

        def candidate_done(self, result, measured):  # type: ignore[no-untyped-def]
            self.done += 1

    workflow = tiny_workflow(
        tiny_onnx,
        evaluate=[{"id": "fidelity", "evaluator": "fidelity", "config": {"data": "rows"}}],
        select={"objective": {"metric": "fidelity.cosine_mean", "goal": "max"}},
    )
    record = Record()
    run_workflow(load_workflow(write_workflow(tmp_path, workflow)), Store(tmp_path / "store"), record)
    assert record.started == [("cpu", 3)] and record.done == 3  # the reference and the two per_channel points


@pytest.mark.parametrize(
    ("steps", "target"),
    [
        # a baseline outside the searched values is a candidate of its own
        (
            [
                {
                    "id": "int8",
                    "pass": "ort_quantize",
                    "config": {"mode": "dynamic", "per_channel": True},
                    "search": {"per_channel": [False, True], "reduce_range": [True]},
                }
            ],
            {},
        ),
        # an optional step: skipping it is the input model, the reference
        (
            [
                {
                    "id": "int8",
                    "pass": "ort_quantize",
                    "optional": True,
                    "config": {"mode": "dynamic"},
                    "search": {"per_channel": [False, True]},
                }
            ],
            {},
        ),
        # searched session settings, screened on the reference first
        (
            [{"id": "int8", "pass": "ort_quantize", "config": {"mode": "dynamic"}, "search": {"per_channel": [False, True]}}],
            {"search": {"graph_optimization_level": ["basic", "all"]}},
        ),
    ],
    ids=["baseline-outside", "optional-step", "settings"],
)
def test_the_announced_total_is_what_the_search_processes(tmp_path, tiny_onnx, steps, target):
    from engine_helpers import tiny_workflow, write_workflow

    from engine.execute.hooks import Hooks
    from engine.run import run_workflow
    from engine.store.store import Store
    from engine.workflow import load_workflow

    class Record(Hooks):
        def __init__(self) -> None:
            self.started: list[int | None] = []
            self.done = 0

        def target_started(self, target: str, candidates: int | None) -> None:
            self.started.append(candidates)

        def candidate_done(self, result, measured):  # type: ignore[no-untyped-def]
            self.done += 1

    workflow = tiny_workflow(
        tiny_onnx,
        targets=[{"id": "cpu", "runtime": "onnxruntime", "intra_op_threads": 1, **target}],
        steps=steps,
        evaluate=[{"id": "fidelity", "evaluator": "fidelity", "config": {"data": "rows"}}],
        select={"objective": {"metric": "fidelity.cosine_mean", "goal": "max"}},
        search={"baselines": True},
    )
    record = Record()
    run_workflow(load_workflow(write_workflow(tmp_path, workflow)), Store(tmp_path / "store"), record)
    assert record.started == [record.done]


def test_more_candidates_than_estimated_never_show_more_done_than_total_and_eta_follows_finished_work():
    clock = Clock()
    console = Console(file=io.StringIO(), force_terminal=True, width=200, color_system=None)
    progress = LiveProgress(console, "latency.p50_ms", "min", clock=clock)
    progress.target_started("cpu", 2)
    assert "-:--:--" in _render(progress)  # nothing finished: no estimate
    progress.job_started(_job("export"))
    clock.now += 60.0
    progress.job_done(_job("export"), "ran", 60.0)
    assert "0:02:00" in _render(progress)  # one job of the first candidate took a minute: 2 candidates left
    for index in range(3):
        clock.now += 60.0
        progress.candidate_done(_result("cpu", index, 5.0), measured=True)  # type: ignore[arg-type]
    out = _render(progress)
    assert "3/3 candidates, 0 left" in out and "0:00:00" in out
