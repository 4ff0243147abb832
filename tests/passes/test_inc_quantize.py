"""Intel Neural Compressor's passes for real: inc_quantize (static QOperator and QDQ, dynamic) and
inc_quantize_accuracy (tuned against a workflow evaluation) quantize the small digits CNN in the
isolated environment the passes declare (neural-compressor 3.7.1, numpy 1.26, onnx 1.18; built
once per test session, or found in ``$KILN_ENVS_DIR``), run by the engine as a workflow would be.
Their models must load in the main environment's onnxruntime."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from pydantic import ValidationError

from engine.core.config import EnvironmentSpec, library_versions
from engine.core.errors import KilnError
from engine.execute.environments import ensure, existing, prepare
from engine.report.emit import lock_document
from engine.run import run_workflow
from engine.select.results import RunReport
from engine.store.store import Store
from engine.workflow import load_workflow
from passes.quantize._inc import INC_ENVIRONMENT, INC_REQUIREMENTS
from passes.quantize.inc_quantize import IncQuantize
from passes.quantize.inc_quantize_accuracy import IncQuantizeAccuracy

DIGITS_CNN = Path(__file__).resolve().parents[2] / "workflows" / "models" / "digits_cnn.py"
INC_VERSIONS = {"neural-compressor": "3.7.1", "numpy": "1.26.4", "onnx": "1.18.0", "onnxruntime": "1.31.1"}
DIGITS = {"source": "sklearn", "name": "digits", "reshape": [1, 8, 8], "scale": 0.0625}


def _digits(count: int, take: str) -> dict[str, Any]:
    return {**DIGITS, "split": {"take": take, "count": count}}


@pytest.fixture(scope="module")
def digits_cnn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits workflow's CNN, trained for 3 epochs (seconds), exported to ONNX (opset 17)."""
    import torch

    spec = importlib.util.spec_from_file_location("digits_cnn", DIGITS_CNN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, example = module.build(epochs=3)
    path = tmp_path_factory.mktemp("cnn") / "model.onnx"
    torch.onnx.export(
        model, (example["input"],), str(path), input_names=["input"], output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17, dynamo=False,
    )  # fmt: skip
    return path


def _workflow(cnn: Path) -> dict[str, Any]:
    return {
        "version": 1,
        "name": "inc-digits",
        "input": {"format": "onnx", "path": str(cnn)},
        "data": {"calibration": _digits(50, "first"), "heldout": _digits(300, "last")},
        "targets": [{"id": "cpu", "runtime": "onnxruntime", "intra_op_threads": 1}],
        "steps": [
            {"id": "static", "pass": "inc_quantize", "config": {"mode": "static", "calibration": "calibration"},
             "search": {"quant_format": ["QOperator", "QDQ"]}},
            {"id": "dynamic", "pass": "inc_quantize", "config": {"mode": "dynamic"}},
            {"id": "tuned", "pass": "inc_quantize_accuracy",
             "config": {"calibration": "calibration", "validation": "accuracy", "metric": "top1", "tolerable_loss": 0.02,
                        "loss_type": "absolute", "max_trials": 3}},
            {"id": "unmet", "pass": "inc_quantize_accuracy",  # dynamic INT8 never keeps cosine 1.0 exactly
             "config": {"mode": "dynamic", "validation": "fidelity", "metric": "cosine_mean", "tolerable_loss": 0.0,
                        "loss_type": "absolute", "max_trials": 2}},
        ],
        "evaluate": [
            {"id": "accuracy", "evaluator": "accuracy", "config": {"data": "heldout", "batch_size": 64}},
            {"id": "fidelity", "evaluator": "fidelity", "config": {"data": "heldout"}, "candidates": False},
        ],
        "select": {"objective": {"metric": "accuracy.top1", "goal": "max"}},
        "search": {"sampler": "grid"},
    }  # fmt: skip


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory: pytest.TempPathFactory, digits_cnn: Path, inc_env: Any, envs_dir: Path) -> RunReport:
    """The workflow run once by the engine, from a working folder of its own."""
    import yaml

    folder = tmp_path_factory.mktemp("inc-run")
    path = folder / "workflow.yaml"
    path.write_text(yaml.safe_dump(_workflow(digits_cnn), sort_keys=False))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KILN_ENVS_DIR", str(envs_dir))
        patch.chdir(folder)
        return run_workflow(load_workflow(path), Store(folder / "store"), workers=2)


def _inc_jobs(report: RunReport) -> dict[str, dict[str, Any]]:
    """The INC jobs' records by label (``static(quant_format=QDQ)``, ``tuned``...)."""
    found = {}
    for job_id, state in report.jobs.items():
        spec = report.plan.spec(job_id)
        if spec.pass_name.startswith("inc_"):
            assert state.record is not None, f"{spec.label}: {state.error}"
            found[spec.label] = state.record
    return found


def _candidate(report: RunReport, label: str) -> Any:
    """The candidate whose last job has ``label``."""
    return next(r for r in report.results if r.candidate.jobs and report.plan.spec(r.candidate.jobs[-1]).label == label)


# -- the environment -------------------------------------------------------------------------------
def test_the_passes_declare_their_pinned_environment(tmp_path, digits_cnn, monkeypatch):
    assert IncQuantize.environment == IncQuantizeAccuracy.environment == INC_ENVIRONMENT
    assert all("==" in requirement for requirement in INC_REQUIREMENTS)  # every requirement pinned
    monkeypatch.setenv("KILN_ENVS_DIR", str(tmp_path / "no-envs"))
    workflow = _workflow(digits_cnn)
    workflow["steps"][1]["environment"] = {"requirements": ["neural-compressor==3.7.1", "numpy<2", "onnx==1.18.0", "six", "setuptools<81"]}
    path = tmp_path / "workflow.json"
    path.write_text(json.dumps(workflow))
    resolved = load_workflow(path)
    assert resolved.steps["static"].environment == INC_ENVIRONMENT  # the workflow names none: the pass's
    assert resolved.steps["dynamic"].environment != INC_ENVIRONMENT  # a step's own replaces it
    notes = prepare(resolved, tmp_path / "store", build=False)
    assert any(INC_ENVIRONMENT.key()[:12] in note and "not built yet" in note for note in notes)


def test_the_environment_shadows_numpy_and_onnx_and_keeps_kiln_importable(inc_env):
    code = (
        "import json, numpy, onnx, onnxruntime, engine.execute.worker, evaluators.accuracy, evaluators.fidelity, targets.onnxruntime;"
        "import passes.quantize.inc_quantize, passes.quantize.inc_quantize_accuracy;"
        "from engine.conformance import tiny_onnx_model; import pathlib, tempfile;"
        "path = tiny_onnx_model(pathlib.Path(tempfile.mkdtemp()));"
        "session = onnxruntime.InferenceSession(str(path), providers=['CPUExecutionProvider']);"
        "feed = {i.name: numpy.ones([d if isinstance(d, int) else 2 for d in i.shape], numpy.float32) for i in session.get_inputs()};"
        "out = session.run(None, feed)[0];"
        "print(json.dumps({'numpy': numpy.__version__, 'onnx': onnx.__version__, 'shape': list(out.shape)}))"
    )
    done = subprocess.run([inc_env.python, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["numpy"] == "1.26.4" and found["onnx"] == "1.18.0" and found["shape"]
    assert library_versions(["numpy"])["numpy"] != "1.26.4"  # the main environment keeps its own
    assert dict(inc_env.versions)["neural-compressor"] == "3.7.1"


def test_a_failed_build_names_the_bogus_pin(tmp_path):
    bogus = EnvironmentSpec(requirements=[r for r in INC_REQUIREMENTS if not r.startswith("onnx==")] + ["onnx==1.18.999"])
    with pytest.raises(KilnError) as caught:
        ensure(bogus, tmp_path / "envs")
    assert "requirement 'onnx==1.18.999' could not be installed" in str(caught.value)
    assert existing(bogus, tmp_path / "envs") is None


# -- the passes, run by the engine in the environment ---------------------------------------------
def test_every_job_ran_there_and_its_key_names_the_environments_versions(digits_run):
    jobs = _inc_jobs(digits_run)
    assert set(jobs) == {"static(quant_format=QOperator)", "static(quant_format=QDQ)", "dynamic", "tuned", "unmet"}
    for label, record in jobs.items():
        assert record["details"]["versions"] == INC_VERSIONS, label  # what the worker imported
        assert record["key_doc"]["libraries"] == INC_VERSIONS, label  # what the job key names
        environment = record["key_doc"]["environment"]
        assert environment["requirements"] == sorted(INC_REQUIREMENTS) and environment["packages"], label


def test_the_lock_lists_the_environment_and_its_exact_versions(digits_run):
    lock = lock_document(digits_run)
    entry = lock["environments"][INC_ENVIRONMENT.key()]
    assert entry["steps"] == ["dynamic", "static", "tuned", "unmet"]
    assert entry["libraries"] == INC_VERSIONS
    assert entry["versions"]["neural-compressor"] == "3.7.1" and entry["versions"]["six"] == "1.17.0"
    assert "neural-compressor" not in lock["libraries"]  # the main environment's list holds only its own


def test_the_quantized_models_load_and_classify_in_the_main_onnxruntime(digits_run):
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images[-300:] / 16.0).astype(np.float32)[:, None]
    reference = next(r for r in digits_run.results if r.candidate.reference)
    expected = {"static(quant_format=QOperator)": "QLinearConv", "static(quant_format=QDQ)": "QuantizeLinear", "dynamic": "ConvInteger"}
    for label, op_type in expected.items():
        result = _candidate(digits_run, label)
        assert result.state == "complete", result.reason
        model_file = result.model.model_file
        assert op_type in {node.op_type for node in onnx.load(str(model_file)).graph.node}, label
        session = onnxruntime.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
        predicted = session.run(None, {"input": images})[0].argmax(axis=1)
        top1 = float((predicted == digits.target[-300:]).mean())
        assert top1 == pytest.approx(result.metrics["accuracy.top1"])  # the engine measured this model
        assert top1 >= reference.metrics["accuracy.top1"] - 0.05, label


def test_accuracy_tuning_is_judged_by_the_workflow_evaluation(digits_run):
    details = _inc_jobs(digits_run)["tuned"]["details"]
    trajectory = details["trajectory"]
    assert trajectory[0]["baseline"] and trajectory[0]["metric"] == details["baseline_metric"]
    assert details["bar_met"] and details["final_loss"] <= 0.02 and details["trials"] >= 1
    # the output's heldout accuracy, measured again by the engine, is the value the tuning saw
    assert _candidate(digits_run, "tuned").metrics["accuracy.top1"] == pytest.approx(details["final_metric"])


def test_a_bar_no_model_meets_gives_the_best_model_tried_with_a_note(digits_run):
    record = _inc_jobs(digits_run)["unmet"]
    details = record["details"]
    assert details["bar_met"] is False and details["baseline_metric"] == pytest.approx(1.0)
    tried = [t for t in details["trajectory"] if not t["baseline"]]
    best = max(tried, key=lambda t: t["metric"])
    assert record["digest"] == best["digest"] and details["final_metric"] == best["metric"] < 1.0
    assert any("no model INC tried met the bar" in note for note in record["notes"])


def test_inc_logs_go_to_the_job_log_and_its_workspace_stays_in_the_work_folder(digits_run):
    for label, record in _inc_jobs(digits_run).items():
        key = next(s.key for s in digits_run.jobs.values() if s.record is record)
        log = (digits_run.store.root / "logs" / f"{key}.log").read_text()
        assert "[INFO]" in log and "Save tuning history to" in log, label  # INC's own logger, in the job log
        workspace = log.split("Save tuning history to ", 1)[1].split()[0]
        assert "/work/nc_workspace/" in workspace, workspace
    assert not (Path.cwd() / "nc_workspace").exists()


# -- options ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"mode": "dynamic", "calibration": "c"}, "apply to mode static only"),
        ({"mode": "static"}, "mode static needs calibration"),
        ({"mode": "dynamic", "quant_format": "QDQ"}, "QOperator models only"),
        ({"mode": "static", "calibration": "c", "smooth_quant_alpha": 0.6}, "needs smooth_quant"),
    ],
)
def test_options_that_contradict_each_other_are_errors(config, message):
    with pytest.raises(ValidationError, match=message):
        IncQuantize.Config(**config)


def test_static_defaults_are_filled_in_so_the_key_names_them():
    config = IncQuantizeAccuracy.Config(calibration="c", validation="accuracy", metric="top1").to_json()
    assert config["mode"] == "static" and config["calibration_method"] == "minmax" and config["calibration_samples"] == 100
    assert IncQuantize.Config().to_json()["calibration_method"] is None  # dynamic by default: nothing to calibrate
