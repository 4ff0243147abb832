"""The run's short summary for CI (`engine run --summary FILE`, `engine show RUN --format`):
written whatever the run's end, valid against the published JSON Schema, the same document
`engine show` gives, Markdown fit for GitHub Actions' job summary."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
from engine_helpers import engine_cmd, tiny_workflow, write_workflow

from engine.cli.main import main
from engine.report.summary import schema, summary_format


def _engine(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*engine_cmd(), *args], capture_output=True, text=True, timeout=300)


def _valid(document: dict) -> dict:
    jsonschema.Draft202012Validator(schema(), format_checker=jsonschema.FormatChecker()).validate(document)
    return document


def test_the_json_summary_is_valid_and_is_what_engine_show_gives(tmp_path, tiny_onnx) -> None:
    path = write_workflow(tmp_path, tiny_workflow(tiny_onnx))
    store, summary = tmp_path / "store", tmp_path / "ci" / "summary.json"
    done = _engine("run", str(path), "--store", str(store), "-o", str(tmp_path / "out"), "--quiet", "--summary", str(summary))
    assert done.returncode == 0, done.stderr
    written = _valid(json.loads(summary.read_text()))
    assert written["exit"] == {"code": 0, "status": "ok", "reason": "a model was chosen for every available target"}
    assert written["run"]["workflow"] == "tiny" and written["run"]["wall_s"] > 0 and written["run"]["id"]
    [target] = written["targets"]
    records = json.loads((tmp_path / "out" / "candidates.json").read_text())["candidates"]
    chosen = next(r for r in records if r["chosen"])
    assert target["chosen"]["candidate"] == chosen["id"] and target["chosen"]["why"] == chosen["verdict"]
    objective = target["chosen"]["objective"]
    assert objective["metric"] == "latency.p50_ms" and objective["value"] == chosen["metrics"]["latency.p50_ms"]
    assert objective["low"] == chosen["intervals"]["latency.p50_ms"]["low"]
    [bar] = target["chosen"]["constraints"]
    assert bar["metric"] == "fidelity.cosine_mean" and bar["bounds"] == {"min": 0.9} and bar["met"] is True
    assert target["candidates"]["total"] == len(records) == 3
    shown = _engine("show", "last", "--store", str(store), "--format", "json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == written and shown.stdout == summary.read_text()
    markdown = _engine("show", written["run"]["id"], "--store", str(store), "--format", "md").stdout
    assert markdown.startswith("### Kiln: tiny: a model for 1 of 1 target(s), exit 0\n")


def test_a_failed_run_writes_its_markdown_summary_with_the_reason(tmp_path, tiny_onnx) -> None:
    """Exit 1 (no candidate met the bar): the summary still comes, saying why, as Markdown to a
    file without a suffix (GitHub Actions' $GITHUB_STEP_SUMMARY has none)."""
    workflow = tiny_workflow(tiny_onnx)
    workflow["select"]["constraints"] = [{"metric": "latency.p50_ms", "max": 0.0}]
    path = write_workflow(tmp_path, workflow)
    step_summary = tmp_path / "step_summary_file"
    done = _engine("run", str(path), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out"), "-q", "--summary", str(step_summary))
    assert done.returncode == 1, done.stderr
    lines = step_summary.read_text().splitlines()
    assert lines[0] == "### Kiln: tiny: a model for 0 of 1 target(s), exit 1" and lines[1] == ""
    assert lines[2] == "| target | chosen | latency.p50_ms (min) | vs reference | latency.p50_ms (max 0) | why |"
    assert lines[3] == "|---|---|---|---|---|---|"
    assert lines[4].startswith("| cpu | none | — | — | — | none of the 3 complete candidate(s) met the constraints; e.g. cpu/")
    assert "> max 0" in lines[4] and lines[5] == ""
    assert lines[6].startswith("Run `") and lines[6].endswith("exit 1: no model chosen for cpu: " + lines[4].split(" | ")[-1][:-2])
    shown = json.loads(_engine("show", "last", "--store", str(tmp_path / "store"), "--format", "json").stdout)
    _valid(shown)
    assert shown["exit"]["code"] == 1 and shown["exit"]["status"] == "no-choice"
    assert shown["targets"][0]["chosen"] is None and "met the constraints" in shown["targets"][0]["why_none"]


def test_a_refused_workflow_still_writes_its_summary_with_the_first_problem(tmp_path, tiny_onnx) -> None:
    """Exit 2 before the run begins (an unknown pass): the CI job's summary says why, valid
    against the schema, with no run and no targets."""
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"][0]["pass"] = "no_such_pass"
    path = write_workflow(tmp_path, workflow)
    summary = tmp_path / "summary.json"
    done = _engine("run", str(path), "--store", str(tmp_path / "store"), "-q", "--summary", str(summary))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    written = _valid(json.loads(summary.read_text()))
    assert written["exit"]["code"] == 2 and written["exit"]["status"] == "refused"
    assert "no_such_pass" in written["exit"]["reason"] and str(path) in written["exit"]["reason"]
    assert written["run"]["id"] is None and written["run"]["workflow_file"] == str(path) and written["targets"] == []


def test_the_summary_schema_is_published_by_engine_schema(capsys) -> None:
    assert main(["schema", "--summary"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == schema() and printed["properties"]["kiln_summary"] == {
        "const": 1,
        "description": printed["properties"]["kiln_summary"]["description"],
    }
    jsonschema.Draft202012Validator.check_schema(printed)
    packaged = Path(__file__).parents[2] / "engine" / "report" / "summary.schema.json"
    assert json.loads(packaged.read_text()) == printed


def test_the_format_follows_the_suffix_and_defaults_to_markdown() -> None:
    assert summary_format(Path("s.json"), None) == "json" and summary_format(Path("S.JSON"), None) == "json"
    assert summary_format(Path("s.md"), None) == "md" and summary_format(Path("/tmp/step_summary_x"), None) == "md"
    assert summary_format(Path("s.json"), "md") == "md"


def test_a_fleet_refuses_one_summary_file_before_running(tmp_path, tiny_onnx, capsys) -> None:
    first = write_workflow(tmp_path / "a", tiny_workflow(tiny_onnx))
    second = write_workflow(tmp_path / "b", tiny_workflow(tiny_onnx, name="tiny-b"))
    assert main(["run", str(first), str(second), "--store", str(tmp_path / "store"), "--summary", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err
    assert "--summary" in err and "2 workflows" in err and not (tmp_path / "s.json").exists() and not (tmp_path / "store").exists()
