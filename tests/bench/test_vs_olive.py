"""bench/vs_olive.py without Olive: its config writers give Olive a RunConfig of the intended
pass chain and Kiln a workflow that `engine validate` accepts, and its summary pairs runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import _vs_olive_setup as setup  # noqa: E402
import vs_olive  # noqa: E402


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    folder = tmp_path_factory.mktemp("vs-olive")
    return {job: setup.write_configs(job, folder, folder / "cache", folder / "out") for job in setup.JOBS}


def test_olive_configs_chain_the_intended_passes(written):
    ort = json.loads(written["ort"][0].read_text())
    ov = json.loads(written["ov"][0].read_text())
    assert [p["type"] for p in ort["passes"].values()] == ["OnnxConversion", "OrtTransformersOptimization", "OnnxDynamicQuantization"]
    assert ort["passes"]["fusion"]["model_type"] == "bert" and ort["passes"]["conversion"]["target_opset"] == 17
    assert [p["type"] for p in ov["passes"].values()] == ["OpenVINOConversion", "OpenVINOQuantization"]
    assert ov["passes"]["quantization"]["data_config"] == "calibration_data"
    for config in (ort, ov):
        assert config["input_model"] == {"type": "HfModel", "model_path": str(setup.model_dir()), "task": "feature-extraction"}
        assert config["evaluate_input_model"] is False and config["cache_dir"].endswith("cache")
        latency = config["evaluators"]["latency_evaluator"]["metrics"][0]
        timing = latency["sub_types"][0]["metric_config"]
        assert latency["type"] == "latency" and (timing["warmup_num"], timing["repeat_test_num"]) == (setup.WARMUP, setup.RUNS)
        calibration = next(d for d in config["data_configs"] if d["name"] == "calibration_data")
        assert calibration["load_dataset_config"]["params"]["count"] == setup.CALIBRATION_LINES
        assert Path(calibration["user_script"]).is_file()


def test_kiln_workflows_match_and_validate(written):
    for job, (_, kiln, with_reference) in written.items():
        workflow = json.loads(kiln.read_text())
        latency = workflow["evaluate"][0]["config"]
        assert (latency["warmup"], latency["runs"], latency["compare"]) == (setup.WARMUP, setup.RUNS, False)
        assert workflow["search"]["baselines"] is False and workflow["targets"][0]["id"] == setup.TARGET_ID[job]
        assert workflow["search"]["reference"] is False  # as Olive's evaluate_input_model: false
        default = json.loads(with_reference.read_text())
        assert "reference" not in default["search"] and {k: v for k, v in default.items() if k != "search"} == {
            k: v for k, v in workflow.items() if k != "search"
        }
    assert [s["pass"] for s in json.loads(written["ort"][1].read_text())["steps"]] == ["torch_export", "ort_fusion", "ort_quantize"]
    assert [s["pass"] for s in json.loads(written["ov"][1].read_text())["steps"]] == ["openvino_convert", "nncf_quantize"]
    done = subprocess.run(
        [sys.executable, "-m", "engine.cli.main", "validate", *(str(k) for _, *kiln in written.values() for k in kiln)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("valid") == 4


def test_kiln_s_translation_of_the_olive_config_does_the_same_work(written):
    from engine.olive.importer import translate

    for olive, kiln, _ in written.values():
        translation = translate(json.loads(olive.read_text()), olive)
        assert translation.workflow["search"].get("reference") is False  # Olive's evaluate_input_model: false
        assert [s["pass"] for s in translation.workflow["steps"]] == [s["pass"] for s in json.loads(kiln.read_text())["steps"]]


def test_an_olive_run_without_a_model_is_a_failure(tmp_path):
    log = tmp_path / "olive.log"
    log.write_text("Traceback ...\nFileNotFoundError: calibration\nNo output model produced. Please check the log for details.\n")
    run = vs_olive.Run("olive", "ov", "cold", 1)
    vs_olive.olive_result(run, 0, log, tmp_path / "out")
    assert not run.ok and "No output model produced" in (run.error or "")


def test_summary_pairs_rounds_and_skips_failures():
    runs = [
        vs_olive.Run("olive", "ort", "cold", 1, wall_s=40.0, cpu_s=50.0, peak_rss_mb=900.0, ok=True),
        vs_olive.Run("kiln", "ort", "cold", 1, wall_s=20.0, cpu_s=30.0, peak_rss_mb=600.0, ok=True),
        vs_olive.Run("olive", "ort", "cold", 2, wall_s=30.0, cpu_s=40.0, peak_rss_mb=800.0, ok=True),
        vs_olive.Run("kiln", "ort", "cold", 2, wall_s=30.0, ok=False, error="exit 2"),
        vs_olive.Run("kiln+ref", "ort", "cold", 1, wall_s=24.0, ok=True),
        vs_olive.Run("kiln+ref", "ort", "cold", 2, wall_s=21.0, ok=True),
    ]
    entry = vs_olive.summarize(runs)["ort/cold"]
    assert entry["kiln+ref_over_olive"]["wall_paired_median"] == pytest.approx((24.0 / 40.0 + 21.0 / 30.0) / 2)
    assert entry["olive"]["wall_median_s"] == 35.0 and entry["kiln"]["runs_ok"] == 1
    assert entry["kiln_over_olive"]["wall_paired_median"] == 0.5
    assert entry["kiln_over_olive"]["wall"] == pytest.approx(20.0 / 35.0)
    vs_olive.print_table(vs_olive.summarize(runs))  # the table and the goals' lines render with a phase missing
