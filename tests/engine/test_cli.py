"""The CLI surface: help is instant, schema is valid JSON Schema, listings show options, plan
shows HIT/MISS and explains misses."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import jsonschema
import yaml
from engine_helpers import engine_cmd, tiny_workflow, two_targets, write_workflow

from engine.cli.main import main
from engine.run import run_workflow
from engine.store.store import Store
from engine.workflow import load_workflow


def test_help_does_not_import_heavy_libraries():
    code = "import sys; from engine.cli.main import _parser; _parser().format_help(); print(sorted(m for m in ('torch','onnx','onnxruntime','transformers','numpy','rich') if m in sys.modules))"
    done = subprocess.run([engine_cmd()[0], "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_schema_is_valid_json_schema_and_accepts_the_shipped_workflows(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    jsonschema.Draft202012Validator.check_schema(schema)
    from pathlib import Path

    for path in sorted(Path(__file__).parents[2].joinpath("workflows").glob("*.*")):
        if path.suffix in (".yaml", ".yml", ".json"):
            document = yaml.safe_load(path.read_text())
            jsonschema.validate(document, schema)


def test_schema_rejects_an_unknown_pass_option(capsys):
    main(["schema"])
    schema = json.loads(capsys.readouterr().out)
    step = {"id": "q", "pass": "ort_quantize", "config": {"per_chanel": True}}
    validator = jsonschema.Draft202012Validator(schema)
    document = {
        "version": 1,
        "name": "x",
        "input": {"format": "onnx", "path": "m.onnx"},
        "targets": [{"id": "c", "runtime": "onnxruntime"}],
        "steps": [step],
        "evaluate": [{"id": "l", "evaluator": "latency"}],
        "select": {"objective": {"metric": "l.p50_ms"}},
    }
    errors = list(validator.iter_errors(document))
    assert any("per_chanel" in e.message for e in errors)


def test_passes_listing_shows_options_with_types_and_defaults(capsys):
    assert main(["passes"]) == 0
    listing = capsys.readouterr().out
    assert "ort_quantize" in listing and "torch_export" in listing
    assert main(["passes", "ort_quantize"]) == 0
    detail = capsys.readouterr().out
    assert "per_channel" in detail and "bool" in detail and "false" in detail


def test_unknown_plugin_name_exits_2_with_a_suggestion(capsys):
    assert main(["passes", "ort_quantise"]) == 2
    assert "Did you mean 'ort_quantize'?" in capsys.readouterr().err


def test_plan_shows_misses_then_hits_and_explains_a_change(tmp_path, tiny_onnx, capsys):
    workflow = tiny_workflow(tiny_onnx)
    path = write_workflow(tmp_path, workflow)
    store = tmp_path / "store"
    assert main(["plan", str(path), "--store", str(store)]) == 0
    before = capsys.readouterr().out
    assert before.count("MISS int8") == 2 and "HIT" not in before
    run_workflow(load_workflow(path), Store(store))
    assert main(["plan", str(path), "--store", str(store)]) == 0
    after = capsys.readouterr().out
    assert after.count("HIT  int8") == 2 and "MISS" not in after
    workflow["steps"][0]["config"]["reduce_range"] = True
    write_workflow(tmp_path, workflow)
    assert main(["plan", str(path), "--store", str(store), "--explain"]) == 0
    explained = capsys.readouterr().out
    assert "changed since the last run: config.reduce_range" in explained


def test_plan_lists_every_candidate_the_run_evaluates_baselines_included(tmp_path, tiny_onnx, capsys):
    workflow = tiny_workflow(tiny_onnx, search={"sampler": "grid"})  # baselines on, as by default
    # the search holds only per_channel true; the baseline runs the pass's default (false)
    workflow["steps"][0]["search"] = {"per_channel": [True], "reduce_range": [False, True]}
    workflow["evaluate"] = [{"id": "size", "evaluator": "size"}]
    workflow["select"] = {"objective": {"metric": "size.file_bytes", "goal": "min"}}
    path = write_workflow(tmp_path, workflow)
    store, out = tmp_path / "store", tmp_path / "out"
    assert main(["plan", str(path), "--store", str(store)]) == 0
    shown = capsys.readouterr().out
    planned = int(shown.split(" candidates x ")[0].rsplit("\n", 1)[-1].split()[-1])
    assert "(baseline)" in shown
    assert main(["run", str(path), "--store", str(store), "-o", str(out), "-q"]) == 0
    ran = json.loads((out / "candidates.json").read_text())["candidates"]
    assert planned == len(ran) == 4  # reference, the baseline, two searched points
    assert [c["path"] for c in ran].count("int8(per_channel=false, reduce_range=false)") == 1
    assert [c["id"].split("/")[-1] for c in ran] == [
        line.split()[0] for line in shown.splitlines() if line.startswith("  ") and line.split()[0].isdigit()
    ]


# -- exit codes: bad input 2, a bug in Kiln 3 (issue 9, item 10) ------------------------------------
def test_an_internal_error_exits_3_says_it_is_a_bug_and_where_the_log_is(tmp_path, tiny_onnx, capsys, monkeypatch):
    import engine.run

    def broken(*args, **kwargs):
        raise KeyError("candidates")

    monkeypatch.setattr(engine.run, "run_workflow", broken)
    monkeypatch.setenv("KILN_LOG_DIR", str(tmp_path / "logs"))
    path = write_workflow(tmp_path, tiny_workflow(tiny_onnx))
    code = main(["run", str(path), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 3
    assert "this is a bug in Kiln" in err and "KeyError" in err and "Traceback" not in err
    (log,) = (tmp_path / "logs").glob("kiln-crash-*.log")
    assert str(log) in err and "Traceback" in log.read_text() and "broken" in log.read_text()


def test_a_store_that_cannot_be_created_is_bad_input(tmp_path, tiny_onnx, capsys):
    (tmp_path / "afile").write_text("")
    path = write_workflow(tmp_path, tiny_workflow(tiny_onnx))
    code = main(["run", str(path), "--store", str(tmp_path / "afile" / "store"), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert "--store" in err and "afile" in err and "Traceback" not in err


def test_an_output_folder_that_cannot_be_created_is_bad_input(tmp_path, tiny_onnx, capsys):
    (tmp_path / "afile").write_text("")
    path = write_workflow(tmp_path, tiny_workflow(tiny_onnx))
    code = main(["run", str(path), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "afile" / "out")])
    assert code == 2
    assert "--output" in capsys.readouterr().err


def test_sigterm_stops_a_run_like_ctrl_c(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [{"id": "slow", "pass": "sleep", "config": {"seconds": 60}}]
    path = write_workflow(tmp_path, workflow)
    process = subprocess.Popen(
        [*engine_cmd(), "run", str(path), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while time.time() < deadline and not list((tmp_path / "store" / "logs").glob("*.log")):
        time.sleep(0.1)
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert "interrupted" in err and "run the same command again" in err
    assert list((tmp_path / "store" / "tmp").iterdir()) == []  # its worker's staging went with it


def test_an_interrupted_run_of_targets_searched_at_once_stops_and_writes_its_summary(tmp_path, tiny_onnx, test_plugins):
    """Two targets searched at once, each in a long pass: SIGTERM (as Ctrl-C) stops both searches,
    exits 130 within seconds, and the --summary file says the run was interrupted."""
    path = write_workflow(tmp_path, two_targets(tiny_onnx, 60))
    summary = tmp_path / "summary.json"
    command = [*engine_cmd(), "run", str(path), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out")]
    process = subprocess.Popen(
        [*command, "--workers", "2", "--summary", str(summary)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 90
    while time.time() < deadline and len(list((tmp_path / "store" / "logs").glob("*.log"))) < 2:
        time.sleep(0.1)  # both sleeps have started: one per target
    time.sleep(1.0)
    began = time.time()
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert time.time() - began < 30  # neither search waited for its 60-s pass
    document = json.loads(summary.read_text())
    assert document["exit"]["status"] == "interrupted" and document["exit"]["code"] == 130


def test_plugin_listings_show_the_default_timeout(capsys):
    assert main(["passes", "ort_quantize"]) == 0
    assert "default timeout: 7200 s" in capsys.readouterr().out
    assert main(["evaluators", "latency"]) == 0
    assert "default timeout: 3600 s" in capsys.readouterr().out


def test_sigterm_with_parallel_workers_kills_them_instead_of_waiting(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx, search={"baselines": False})
    workflow["steps"] = [{"id": "slow", "pass": "sleep", "search": {"seconds": [40.0, 41.0]}}]
    path = write_workflow(tmp_path, workflow)
    process = subprocess.Popen(
        [*engine_cmd(), "run", str(path), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out"), "--workers", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    staging = tmp_path / "store" / "tmp"
    deadline = time.time() + 90
    while time.time() < deadline and len(list(staging.glob("pass-*"))) < 2:
        time.sleep(0.1)
    assert len(list(staging.glob("pass-*"))) == 2, "the two sleep passes never ran at once"
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    started = time.perf_counter()
    _, err = process.communicate(timeout=50)
    assert process.returncode == 130, err
    assert time.perf_counter() - started < 15  # not the 40 s the passes would sleep
    assert list(staging.iterdir()) == []


def test_option_types_are_printed_as_written_in_a_workflow(capsys):
    from typing import Annotated, Any, Literal, Optional

    from engine.text.typetext import type_text

    expected = {
        bool: "bool",
        int | None: "int | null",
        Optional[float]: "float | null",  # noqa: UP045 - the old spelling is read the same
        list[str]: "list[str]",
        tuple[int, ...]: "list[int]",
        dict[str, float]: "dict[str, float]",
        Literal["a", "b"]: '"a" | "b"',
        Literal["a"] | None: '"a" | null',
        Annotated[int, "marker"]: "int",
        list[int] | int | None: "list[int] | int | null",
        Any: "any",
    }
    assert {annotation: type_text(annotation) for annotation in expected} == expected
    for command in (["passes", "ort_quantize"], ["evaluators", "latency"], ["targets", "onnxruntime"]):
        assert main(command) == 0
        out = capsys.readouterr().out
        assert "<class" not in out and "Literal[" not in out and "typing." not in out, command
    assert main(["targets", "onnxruntime"]) == 0
    assert '"cpu" | "cuda"' in capsys.readouterr().out


def test_the_engine_command_keeps_exit_codes_and_output_through_its_quick_exit(tmp_path, tiny_onnx):
    def engine(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*engine_cmd(), *args], capture_output=True, text=True, timeout=120)

    bad = engine("validate", str(tmp_path / "missing.yaml"))
    assert bad.returncode == 2 and "workflow file not found" in bad.stderr
    usage = engine("no-such-command")
    assert usage.returncode == 2 and "invalid choice" in usage.stderr
    workflow = write_workflow(tmp_path, tiny_workflow(tiny_onnx))
    ran = engine("run", str(workflow), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out"), "-q")
    assert ran.returncode == 0, ran.stderr
    assert "chosen for cpu" in ran.stdout  # the summary, flushed before os._exit
    assert json.loads((tmp_path / "out" / "candidates.json").read_text())["candidates"]
