"""Text made for a person: one speedup per candidate, values never rounded onto the bar they
failed, values spelt as in a workflow file, ids in natural order, output fitted to COLUMNS."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console
from rich.text import Text
from test_select import ref, resolved_with, result  # noqa: F401 (ref is a fixture)

from engine.cli.main import main
from engine.core.stats import Interval
from engine.report.report import _candidates_table
from engine.select.results import CandidateResult
from engine.select.select import select, violations
from engine.text import display
from engine.workflow.schema import Constraint


def _text(renderable: object, width: int = 250) -> str:
    out = io.StringIO()
    Console(file=out, width=width, highlight=False).print(renderable)
    return out.getvalue()


def _untimed(tmp_path: Path, number: int) -> CandidateResult:
    """A candidate rejected on fidelity before it was timed: no speedup, no p50."""
    rejected = result(tmp_path, number, speedup=[1.0], cosines=[0.5] * 32)
    rejected.metrics = {"fidelity.cosine_mean": 0.5}
    rejected.samples = {"fidelity.cosine_mean": {"statistic": "mean", "values": [0.5] * 32}}
    return rejected


def test_a_candidate_shows_one_speedup_the_paired_one(tmp_path, tiny_onnx, ref) -> None:  # noqa: F811
    resolved = resolved_with(tmp_path, tiny_onnx)
    fast = result(tmp_path, 1, speedup=[1.98, 2.0, 2.02] * 4, cosines=[1.0] * 32)
    fast.metrics["latency.p50_ms"] = ref.metrics["latency.p50_ms"] / 5.55  # timed apart: another ratio
    results = [ref, fast, _untimed(tmp_path, 2)]
    select(resolved, results)
    table = _text(_candidates_table(SimpleNamespace(resolved=resolved, results=results)))
    row = next(line for line in table.splitlines() if " c1 " in line)
    assert "5.55" not in row
    assert display.speedup(fast.metrics["latency.speedup"]) in row  # the figure the why text gives
    assert "latency.speedup 2" in fast.verdict


def test_a_value_failing_its_bar_is_not_rounded_onto_it() -> None:
    bar = Constraint(metric="fidelity.cosine_mean", min=0.99)
    [just_below] = violations(bar, 0.98996, None)
    assert just_below == "fidelity.cosine_mean = 0.98996 < min 0.99"
    [lucky] = violations(bar, 0.990004, None, Interval(0.990004, 0.989996, 0.9921, 0.95))
    assert "= 0.990004 (lower 95% bound 0.989996) < min 0.99" in lucky
    ratio = Constraint(metric="fidelity.cosine_mean", max_drop_ratio=0.01)
    [dropped] = violations(ratio, 0.98996, 1.0)
    assert "dropped 1.004%" in dropped and "(max 1%)" in dropped


def test_two_figures_compared_in_a_verdict_are_written_apart() -> None:
    """A loser's figure and the winner's are printed with the digits that tell them apart
    (22884114 against 22881666 read "2.288e+07" twice, "worse ... outside its interval")."""
    from engine.select.verdicts import describe

    theirs, mine = Interval(22884114.0, 22884114.0, 22884114.0, 0.95), 22881666.0
    text = describe(None, "size.file_bytes", theirs, mine)
    assert text == "size.file_bytes " + display.against(22884114.0, mine)
    assert float(text.split()[-1]) > mine and display.number(22884114.0) == display.number(mine)


def test_candidate_ids_sort_naturally(tmp_path, tiny_onnx, ref) -> None:  # noqa: F811
    resolved = resolved_with(tmp_path, tiny_onnx)
    results = [ref, *(result(tmp_path, n, speedup=[1.5] * 4, cosines=[1.0] * 32) for n in (10, 2))]
    select(resolved, results)
    table = _text(_candidates_table(SimpleNamespace(resolved=resolved, results=results)))
    assert table.index(" c2 ") < table.index(" c10 ")
    assert sorted(["ov-cpu/10", "ov-cpu/2", "ov-cpu/1"], key=display.natural_key) == ["ov-cpu/1", "ov-cpu/2", "ov-cpu/10"]


def test_a_pass_listing_writes_values_as_a_workflow_does(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["passes", "ort_quantize"]) == 0
    out = capsys.readouterr().out
    assert "{'kind'" not in out and "True" not in out and "False" not in out
    assert "per_channel: one of false, true" in out


def test_tables_are_as_wide_as_columns_says_when_piped(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["passes", "ort_quantize"]) == 0
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 80
    monkeypatch.delenv("COLUMNS")
    assert display.output_width(io.StringIO()) == display.PIPED_WIDTH


def test_validate_wraps_problems_at_the_width_and_keeps_the_place_first(tmp_path, tiny_onnx, capsys, monkeypatch) -> None:
    from engine_helpers import tiny_workflow, write_workflow

    monkeypatch.setattr(display, "message_width", lambda: 80)  # stderr on an 80-column terminal
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"][0]["config"] = {"no_such_option_" + "x" * 10: 1, "another_unknown_option": 2}
    path = write_workflow(tmp_path, workflow)
    assert main(["validate", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    problem = next(line for line in lines if "no_such_option" in line)
    assert problem.startswith(f"{path}:") and ": steps[0].config.no_such_option_xxxxxxxxxx:" in problem
    assert all(len(line) <= 80 for line in lines if not line.startswith(str(path))), lines
    assert all(line.startswith((str(path), "    ")) for line in lines[1:]), lines


def test_wrapped_lines_indent_under_their_label() -> None:
    text = "f.yaml:3: steps[0]: " + "word " * 30 + "\n    expected: " + "one " * 30
    lines = display.wrap(text, 60).splitlines()
    assert lines[0].startswith("f.yaml:3: steps[0]: ") and all(len(line) <= 60 for line in lines)
    expected_at = next(i for i, line in enumerate(lines) if line.startswith("    expected: "))
    assert lines[expected_at + 1].startswith(" " * len("    expected: ") + "one")


def test_messages_piped_stay_one_line_each_even_with_columns_set(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    line = "f.yaml:3: steps[0]: " + "word " * 40
    assert display.wrap(line) == line  # stderr is captured here: not a terminal


def test_the_table_shows_each_candidate_in_the_state_candidates_json_gives_it(tmp_path, tiny_onnx, test_plugins) -> None:
    """A failed step fails its candidate and prunes those that share it: the terminal table said
    "ok" for the pruned ones while candidates.json said "pruned"."""
    import json

    from engine_helpers import tiny_workflow, write_workflow

    from engine.report.emit import write_outputs
    from engine.run import run_workflow
    from engine.store.store import Store
    from engine.workflow import load_workflow

    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [
        {"id": "bad", "pass": "boom"},
        {"id": "after", "pass": "copy", "after": "bad", "search": {"tag": ["x", "y"]}},
    ]
    report = run_workflow(load_workflow(write_workflow(tmp_path, workflow)), Store(tmp_path / "store"))
    written = json.loads((write_outputs(report, tmp_path / "out") / "candidates.json").read_text())
    records = written["candidates"] if isinstance(written, dict) else written
    expected = {r["id"].split("/")[-1]: r["state"] for r in records}
    assert sorted(expected.values()) == ["complete", "failed", "pruned", "pruned"]
    table = _candidates_table(report)
    cells = {column.header: [Text.from_markup(str(cell)).plain for cell in column._cells] for column in table.columns}
    shown = dict(zip(cells["#"], cells["state"], strict=True))
    assert {number: state.split()[0] for number, state in shown.items()} == expected, shown
    assert "ok" not in shown.values()
    rendered = _text(table)
    assert rendered.count("pruned") >= 2 and "failed" in rendered


def test_a_ratio_of_figures_timed_apart_carries_the_bounds_of_both_intervals() -> None:
    """Across targets nothing is interleaved: the ratio is bounded end against end, and says so."""
    from engine.report.report import ratio_apart

    best = Interval(5.0, 4.8, 5.5, 0.95)  # p50 ms of the best, goal min
    other = Interval(20.0, 19.0, 22.0, 0.95)  # p50 ms of another target's reference
    text = ratio_apart(5.0, best, 20.0, other, "min")
    assert text == f"{display.number(4.0)}x [{display.number(19.0 / 5.5)}, {display.number(22.0 / 4.8)}] (timed apart)"
    throughput = ratio_apart(200.0, Interval(200.0, 190.0, 210.0, 0.95), 50.0, Interval(50.0, 45.0, 55.0, 0.95), "max")
    assert throughput.startswith(f"{display.number(4.0)}x [{display.number(190 / 55)}, {display.number(210 / 45)}]")
    assert ratio_apart(5.0, None, 20.0, other, "min") == f"{display.number(4.0)}x (timed apart)"


def test_a_run_written_to_a_file_shows_one_whole_line_per_candidate(tmp_path, tiny_onnx) -> None:
    """Piped or written to a file (a CI log), the candidate table is laid out at the width its
    content needs, whatever COLUMNS says: one line per candidate, every cell whole. It used to be
    laid out at 100 columns with every cell wrapped to a few characters, words cut mid-token."""
    import json
    import os
    import subprocess

    from engine_helpers import engine_cmd, tiny_workflow, write_workflow

    path = write_workflow(tmp_path, tiny_workflow(tiny_onnx))
    log = tmp_path / "run.log"
    with log.open("w") as stdout:
        done = subprocess.run(
            [*engine_cmd(), "run", str(path), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out")],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            env={**os.environ, "COLUMNS": "80"},  # as readline exports it: not the width of a file
        )
    assert done.returncode == 0, done.stderr
    lines = log.read_text(encoding="utf-8").splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    bottom = next(i for i, line in enumerate(lines) if line.startswith("└"))
    width = len(lines[top])
    assert lines[top - 1] == "tiny: candidates" and width > 80
    rows = [line for line in lines[top + 3 : bottom]]
    records = json.loads((tmp_path / "out" / "candidates.json").read_text())["candidates"]
    assert len(rows) == len(records) == 3, "\n".join(lines[top:bottom])
    assert all(len(line) <= width for line in lines[top : bottom + 1])
    for record, row in zip(sorted(records, key=lambda r: r["id"]), rows, strict=True):
        cells = [cell.strip() for cell in row.strip("│").split("│")]
        assert cells[1] == record["id"].split("/")[-1] and cells[2].startswith(record["path"])
        assert cells[-1] == record["verdict"]  # the whole verdict in its one cell
    passes = next(line for line in lines if line.startswith("passes: "))
    assert passes.endswith(" s") and "wall" in passes  # the lines below the table are whole too


def test_on_a_terminal_the_summary_table_still_fits_its_width(tmp_path, tiny_onnx, ref, monkeypatch) -> None:  # noqa: F811
    """The terminal rendering is unchanged: the table is fitted to the terminal's width."""
    from engine.report import report as report_module

    resolved = resolved_with(tmp_path, tiny_onnx)
    results = [ref, *(result(tmp_path, n, speedup=[0.8] * 4, cosines=[1.0] * 32) for n in (1, 2))]
    select(resolved, results)
    run = SimpleNamespace(resolved=resolved, results=results)
    screen = io.StringIO()
    terminal = Console(file=screen, width=90, force_terminal=True, color_system=None, highlight=False)
    monkeypatch.setattr(report_module, "console", terminal)
    from engine.report.candidates_table import print_candidates

    print_candidates(terminal, run)
    shown = screen.getvalue()
    assert shown == _text(_candidates_table(run), width=90)
    assert max(len(line) for line in shown.splitlines()) <= 90 and len(shown.splitlines()) > len(results) + 4  # cells wrap
