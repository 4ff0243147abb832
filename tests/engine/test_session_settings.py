"""A target's searched session settings: a candidate is a model and the settings it runs with."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from engine_helpers import tiny_workflow, write_workflow

from engine.core.errors import InputError
from engine.execute import runner as runner_module
from engine.plan.planner import build_plan
from engine.report.emit import write_outputs
from engine.run import run_workflow
from engine.store.store import Store
from engine.workflow import load_workflow


def settings_workflow(model, threads=(1, 2), **target):
    workflow = tiny_workflow(model, search={"sampler": "grid"})
    workflow["targets"][0].update(target)
    workflow["targets"][0]["search"] = {"intra_op_threads": list(threads)}
    workflow["steps"][0]["search"] = {"per_channel": [False]}
    return workflow


def test_settings_multiply_the_candidates_and_the_target_as_written_is_no_setting(tmp_path, tiny_onnx):
    plan = build_plan(load_workflow(write_workflow(tmp_path, settings_workflow(tiny_onnx))))
    shown = {plan.label(c): c.settings for c in plan.candidates}
    # the target writes intra_op_threads: 1, so threads=1 is the target as written: no settings
    assert shown == {
        "input model": {},
        "input model | session(intra_op_threads=2)": {"intra_op_threads": 2},  # tried on the reference model first
        "int8(per_channel=false)": {},
        "int8(per_channel=false) | session(intra_op_threads=2)": {"intra_op_threads": 2},
    }
    assert plan.candidates[1].screening
    one, two = plan.candidates[2:]
    assert one.jobs == two.jobs  # ort_quantize does not depend on the target: one job for both
    assert one.params["session.intra_op_threads"] == 1 and two.params["session.intra_op_threads"] == 2
    assert plan.fingerprint("cpu", two.settings)["options"]["intra_op_threads"] == 2
    assert plan.fingerprint("cpu")["options"]["intra_op_threads"] == 1


def test_nested_provider_options_are_searched_by_dotted_name(tmp_path, tiny_onnx):
    workflow = settings_workflow(tiny_onnx)
    workflow["targets"][0]["search"] = {"graph_optimization_level": ["basic", "all"], "execution_mode": ["sequential", "parallel"]}
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    space = build_plan(resolved).spaces["cpu"]
    assert len(space.settings_grid()) == 4
    assert space.default_settings() == {"session.graph_optimization_level": "all", "session.execution_mode": "sequential"}


@pytest.mark.parametrize(
    ("search", "message", "where"),
    [
        ({"intra_op_thread": [1, 2]}, "has no option 'intra_op_thread' to search", "did you mean 'intra_op_threads'"),
        ({"device": ["cpu", "cuda"]}, "names the target and cannot be searched", "targets[0].search.device"),
        ({"intra_op_threads": [0, 2]}, "not a valid config of target 'cpu'", "targets[0].search.intra_op_threads"),
        ({"execution_mode": ["sequential", "sideways"]}, "not a valid config of target 'cpu'", "sideways"),
        ({"intra_op_threads": []}, "at least one value", "targets[0].search.intra_op_threads"),
    ],
)
def test_bad_settings_are_refused_where_they_are_written(tmp_path, tiny_onnx, search, message, where):
    workflow = settings_workflow(tiny_onnx)
    workflow["targets"][0]["search"] = search
    with pytest.raises(InputError) as caught:
        load_workflow(write_workflow(tmp_path, workflow))
    text = str(caught.value)
    assert message in text and where in text


def test_a_step_may_not_be_named_session_while_a_target_searches(tmp_path, tiny_onnx):
    workflow = settings_workflow(tiny_onnx)
    workflow["steps"][0]["id"] = "session"
    with pytest.raises(InputError, match="step id 'session' is reserved"):
        load_workflow(write_workflow(tmp_path, workflow))
    del workflow["targets"][0]["search"]
    load_workflow(write_workflow(tmp_path, workflow))  # without a target search the name is free


def test_candidates_run_with_their_settings_against_the_reference_as_written(tmp_path, tiny_onnx):
    resolved = load_workflow(write_workflow(tmp_path, settings_workflow(tiny_onnx)))
    report = run_workflow(resolved, Store(tmp_path / "store"))
    by_label = {r.label: r for r in report.results}
    expected = {
        "input model",
        "input model | session(intra_op_threads=2)",  # the settings screened on the reference model
        "int8(per_channel=false)",
        "int8(per_channel=false) | session(intra_op_threads=2)",
    }
    pruned = [note for note in report.plan.dropped if "settings (intra_op_threads=2) pruned" in note]
    if pruned:  # two threads lost clearly on the reference model on this host: not tried again
        expected.discard("int8(per_channel=false) | session(intra_op_threads=2)")
    assert set(by_label) == expected
    assert all(r.state == "complete" for r in report.results), [(r.label, r.reason) for r in report.results]
    for label, result in by_label.items():
        threads = 2 if "intra_op_threads=2" in label else 1
        assert result.details["latency"]["session"]["intra_op_threads"] == threads
    # the same model under other settings is another evaluation; its fidelity too is keyed apart
    plain, threaded = by_label["input model"], by_label["input model | session(intra_op_threads=2)"]
    assert plain.model.digest == threaded.model.digest
    assert plain.eval_keys["latency"] != threaded.eval_keys["latency"]
    assert report.stats.passes_run == 1  # the quantized model was built once for every setting

    out = write_outputs(report, tmp_path / "out")
    chosen = next(r for r in report.results if r.chosen)
    settings = json.loads((out / "cpu" / "inference_settings.json").read_text())
    assert settings["candidate"] == chosen.candidate.id
    assert settings["searched_settings"] == chosen.candidate.settings
    assert settings["measured"]["by"] == "latency"
    assert settings["measured"]["input_shapes"] == {"input_ids": [1, 16], "attention_mask": [1, 16]}
    assert (out / "cpu" / settings["model"]).is_file()
    # inference.py opens the chosen model the way it was measured, from the target's folder
    done = subprocess.run([sys.executable, "inference.py"], cwd=out / "cpu", capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    records = {c["id"]: c for c in json.loads((out / "candidates.json").read_text())["candidates"]}
    assert records[threaded.candidate.id]["settings"] == {"intra_op_threads": 2}


def test_settings_that_lose_on_the_reference_model_are_pruned(tmp_path, tiny_onnx, monkeypatch):
    """The screening policy, with the latency evaluation replaced by figures that depend on the
    settings alone (threads=1: half as fast, beyond doubt), so the test does not depend on this
    machine's timing: the losing settings are measured once, on the reference model, and never
    built or measured with another model."""
    original = runner_module.Runner._measure

    def measure(self, spec, result, reference):
        if spec.id != "latency":
            return original(self, spec, result, reference)
        threads = result.candidate.settings.get("intra_op_threads", 2)
        speedup = 1.0 if result.candidate.reference else (0.5 if threads == 1 else 1.1)
        values = {"p50_ms": 1.0 / speedup, "speedup": speedup, "speedup_low": speedup, "speedup_high": speedup}
        samples = {"speedup": {"statistic": "median", "values": [speedup * (1 + d) for d in (-0.01, 0.0, 0.01) * 4]}}
        return {"values": values, "details": {}, "samples": samples}, None

    monkeypatch.setattr(runner_module.Runner, "_measure", measure)
    workflow = settings_workflow(tiny_onnx, intra_op_threads=2)
    workflow["steps"][0]["search"] = {"per_channel": [False, True]}
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    report = run_workflow(resolved, Store(tmp_path / "store"))
    labels = [r.label for r in report.results]
    assert "input model | session(intra_op_threads=1)" in labels  # screened
    assert not any("int8" in label and "intra_op_threads=1" in label for label in labels)  # pruned
    assert sum("int8" in label for label in labels) == 2  # per_channel false / true at the target's own settings
    assert any("settings (intra_op_threads=1) pruned" in note for note in report.plan.dropped)


def test_a_setting_the_model_cannot_take_leaves_its_candidate_inapplicable_not_failed(tmp_path, tiny_onnx, test_plugins, capsys):
    """A target that refuses a searched setting for a model (OnnxRuntimeTarget: a CUDA graph for a
    model with nodes on the CPU) raises SettingInapplicable in the worker: the candidate is
    inapplicable with the reason, not failed, and the run goes on to choose among the others."""
    import json

    from engine.report.report import print_summary

    workflow = settings_workflow(tiny_onnx)
    workflow["evaluate"] = [{"id": "placed", "evaluator": "placed"}]
    workflow["select"] = {"objective": {"metric": "placed.bytes", "goal": "min"}}
    report = run_workflow(load_workflow(write_workflow(tmp_path, workflow)), Store(tmp_path / "store"))
    states = {report.plan.label(r.candidate): (str(r.state), r.reason) for r in report.results}
    assert states["int8(per_channel=false) | session(intra_op_threads=2)"] == (
        "inapplicable",
        "target 'cpu': intra_op_threads=2 cannot apply to this model (3 nodes on CPUExecutionProvider)",
    )
    assert states["int8(per_channel=false)"][0] == "complete"
    assert not [label for label, (state, _) in states.items() if state == "failed"]
    assert report.chosen()["cpu"].candidate.settings == {}
    written = json.loads((write_outputs(report, tmp_path / "out") / "candidates.json").read_text())
    records = written["candidates"] if isinstance(written, dict) else written
    assert sorted(r["state"] for r in records).count("inapplicable") == 2
    print_summary(report)
    out = capsys.readouterr().out
    assert "2 candidate(s) inapplicable" in out and "candidate(s) failed" not in out
