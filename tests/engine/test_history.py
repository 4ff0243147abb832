"""The run history: `engine runs`, `engine show RUN`, `engine compare A B` over two runs of the
tiny workflow (the second searches one candidate less), and a killed run shown as interrupted."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from engine.cli.main import main
from engine.report.history import History, runs
from tests.engine.engine_helpers import make_tiny_encoder, tiny_workflow, write_workflow


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("history")
    model = make_tiny_encoder(root / "tiny.onnx")
    store = root / "store"
    first = write_workflow(root / "a", tiny_workflow(model))
    quick = tiny_workflow(model)
    quick["steps"][0]["search"] = {"per_channel": [False]}
    quick["evaluate"][1]["config"]["runs"] = 5  # a changed latency key: measured again
    second = write_workflow(root / "b", quick)
    assert main(["run", str(first), "--store", str(store), "-o", str(root / "out-a"), "-q"]) == 0
    assert main(["run", str(second), "--store", str(store), "-o", str(root / "out-b"), "-q"]) == 0
    latest = History(store).runs()
    return {"store": store, "root": root, "ids": [r.id for r in reversed(latest)]}


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_runs_lists_both(two_runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "runs", "--store", str(two_runs["store"]))
    assert code == 0
    for run_id in two_runs["ids"]:
        assert run_id in out
    assert out.count("ok (0)") == 2
    assert "cpu:" in out  # the chosen candidate per target


def test_show_prints_the_summary(two_runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    first = two_runs["ids"][0]
    code, out, _ = _cli(capsys, "show", first[:6], "--store", str(two_runs["store"]))
    assert code == 0
    assert f"run {first}" in out and "fidelity.cosine_mean" in out and "chose" in out
    code, out, _ = _cli(capsys, "show", "last", "--store", str(two_runs["store"]))
    assert f"run {two_runs['ids'][1]}" in out


def test_compare_shows_what_changed(two_runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = two_runs["ids"]
    code, out, _ = _cli(capsys, "compare", a, b, "--store", str(two_runs["store"]))
    assert code == 0
    assert "workflow:" in out  # another file, another digest
    assert "candidate removed:" in out and "per_channel" in out.split("candidate removed:")[1].splitlines()[0]
    assert "metric " in out and "latency.p50_ms" in out and "intervals " in out  # with whether the intervals overlap
    assert "latency.mean_ms" not in out  # no interval: shown with --all-metrics only
    code, out, _ = _cli(capsys, "compare", a, b, "--all-metrics", "--store", str(two_runs["store"]))
    assert code == 0 and "latency.mean_ms" in out
    assert "choice cpu:" in out


def test_bad_run_ids_are_bad_input(two_runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "show", "zzzz", "--store", str(two_runs["store"]))
    assert code == 2 and "names no run" in err
    code, _, err = _cli(capsys, "compare", "last", "", "--store", str(two_runs["store"]))
    assert code == 2 and "more than one run" in err
    code, _, err = _cli(capsys, "runs", "--store", str(two_runs["root"] / "nowhere"))
    assert code == 2 and "no run history" in err


def test_show_html_writes_the_report_again(two_runs: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    page = tmp_path / "again.html"
    code, out, _ = _cli(capsys, "show", "last", "--store", str(two_runs["store"]), "--html", str(page))
    assert code == 0 and two_runs["ids"][1] in out
    again = page.read_text(encoding="utf-8")
    original = (two_runs["root"] / "out-b" / "report.html").read_text(encoding="utf-8")
    assert again == original  # the history keeps all a report is made of
    assert not list(tmp_path.glob(".*.tmp"))  # written through a staging file, none left behind


def test_a_killed_run_shows_as_interrupted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    history = History(tmp_path)
    with history.engine.begin() as db:
        db.execute(
            runs.insert().values(
                id="deadbeef0000", started=time.time(), workflow_path="w.yaml", name="w", targets=["cpu"], status="running",
                host=socket.gethostname(), pid=dead.pid,
            )
        )  # fmt: skip
    alive = history.start(Path("w.yaml"), None, "w", ["cpu"], tmp_path / "out", "0")
    assert history.find("deadbeef").row["status"] == "interrupted"
    assert history.find(alive).row["status"] == "running"  # this process: still running
    assert os.getpid() == history.find(alive).row["pid"]
    code, out, _ = _cli(capsys, "runs", "--store", str(tmp_path))
    assert code == 0 and "interrupted" in out


def test_a_damaged_history_does_not_stop_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.cli.recorded import recorded
    from engine.store.store import Store

    (tmp_path / "history.sqlite").write_bytes(b"not a database" * 100)
    resolved = type("R", (), {"file": tmp_path / "history.sqlite", "name": "w", "targets": {"cpu": None}})()
    summary = tmp_path / "summary.json"
    assert recorded(Store(tmp_path), resolved, tmp_path / "out", lambda: 0, summary=(summary, "json")) == 0
    assert "not recorded in the history" in capsys.readouterr().err
    written = json.loads(summary.read_text())  # the summary still comes, from the facts in hand
    assert written["run"]["id"] is None and written["exit"]["code"] == 0 and written["targets"][0]["id"] == "cpu"


def test_runs_and_show_keep_ids_and_metric_names_whole_at_80_columns(
    two_runs: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    _, out, _ = _cli(capsys, "runs", "--store", str(two_runs["store"]))
    assert "…" not in out and all(run_id in out for run_id in two_runs["ids"])
    assert max(len(line) for line in out.splitlines()) <= 80
    _, out, _ = _cli(capsys, "show", two_runs["ids"][0], "--store", str(two_runs["store"]))
    table = out.split("\n  cpu: chose")[0]
    assert "…" not in table and max(len(line) for line in table.splitlines()) <= 80
    for name in ("cpu/0", "cpu/1", "fidelity.cosine_mean", "latency.speedup"):
        assert name in table
    assert "True" not in table and "False" not in table
