"""genai_build on a tiny random Llama (tests/decoders.py): ONNX Runtime GenAI's model builder
writes a genai folder that ONNX Runtime GenAI runs and that continues a prompt exactly as the
PyTorch model does (fp32); int4 loads and generates. Both builds are made once per module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from decoder_passes import NEW_TOKENS, PROMPT, og_greedy, run_pass, until_eos
from decoders import greedy
from genai_models import TinyGenai

from engine.core import ModelArtifact, PassError, PassResult
from passes.generate.genai_build import GenaiBuild


@pytest.fixture(scope="module")
def llama(tiny_genai: TinyGenai) -> ModelArtifact:
    return ModelArtifact.from_folder("hf", tiny_genai.hf)


@pytest.fixture(scope="module")
def builds(tiny_genai: TinyGenai) -> dict[str, PassResult]:
    """The fp32 and int4 (block 32) builds of the session's tiny llama (tests/genai_models.py)."""
    return tiny_genai.builds


@pytest.fixture(scope="module")
def fp32(builds: dict[str, PassResult]) -> PassResult:
    return builds["fp32"]


@pytest.fixture(scope="module")
def int4(builds: dict[str, PassResult]) -> PassResult:
    return builds["int4"]


def test_fp32_build_is_a_genai_folder_that_continues_like_pytorch(fp32: PassResult, llama: ModelArtifact) -> None:
    folder = fp32.model.path
    assert fp32.model.format == "genai"
    assert {"genai_config.json", "tokenizer.json", "tokenizer_config.json", "model.onnx"} <= {p.name for p in folder.iterdir()}
    config = json.loads((folder / "genai_config.json").read_text())
    assert config["model"]["decoder"]["filename"] == "model.onnx"
    assert config["model"]["type"] == "llama"
    assert og_greedy(folder, PROMPT, NEW_TOKENS) == until_eos(greedy(llama.path, PROMPT, NEW_TOKENS))
    assert fp32.details["precision"] == "fp32" and fp32.details["execution_provider"] == "cpu"
    assert fp32.details["ops"]["GroupQueryAttention"] == 2
    assert fp32.details["weights_bytes"] > 0


def test_int4_build_quantizes_the_matmuls_and_generates(int4: PassResult, fp32: PassResult) -> None:
    # every weight MatMul of the fp32 build (the builder fuses q/k/v) becomes a MatMulNBits
    assert int4.details["ops"]["MatMulNBits"] == fp32.details["ops"]["MatMul"] == 11
    assert "MatMul" not in int4.details["ops"]
    # hidden 128: the MatMul weights dominate; the embedding table stays float32 (Gather not quantized)
    assert int4.details["weights_bytes"] <= fp32.details["weights_bytes"] / 3.5
    assert "block_size=32" in int4.details["extra_options"]
    assert len(og_greedy(int4.model.path, PROMPT, NEW_TOKENS, ignore_eos=True)) == NEW_TOKENS


def test_int4_weights_quantizes_a_builder_model_and_keeps_its_folder(fp32: PassResult, tmp_path: Path) -> None:
    from passes.quantize.int4_weights import Int4Weights

    result = run_pass(Int4Weights, fp32.model, tmp_path, block_size=32)
    assert result.model.format == "genai" and result.details["quantized"] == {"MatMul": 11}
    assert {"genai_config.json", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in result.model.path.iterdir()}
    assert len(og_greedy(result.model.path, PROMPT, NEW_TOKENS, ignore_eos=True)) == NEW_TOKENS


def test_fp16_on_cpu_is_refused_before_building(llama: ModelArtifact, tmp_path: Path) -> None:
    with pytest.raises(PassError, match="precision fp16 is not built for the cpu execution provider"):
        run_pass(GenaiBuild, llama, tmp_path, precision="fp16")


def test_execution_provider_comes_from_the_target() -> None:
    cpu = {"runtime": "onnxruntime", "options": {"device": "cpu", "providers": ["CPUExecutionProvider"]}}
    gpu = {"runtime": "onnxruntime", "options": {"device": "cuda", "providers": ["CUDAExecutionProvider"]}}
    genai_gpu = {"runtime": "onnxruntime-genai", "options": {"device": "cuda"}}
    assert GenaiBuild.target_facet({"execution_provider": None}, cpu) is None
    assert GenaiBuild.target_facet({"execution_provider": None}, None) is None
    assert GenaiBuild.target_facet({"execution_provider": None}, gpu) == {"execution_provider": "cuda"}
    assert GenaiBuild.target_facet({"execution_provider": None}, genai_gpu) == {"execution_provider": "cuda"}
    assert GenaiBuild.target_facet({"execution_provider": "cpu"}, gpu) is None
    assert GenaiBuild.resolve_for_target({"execution_provider": None}, cpu)["execution_provider"] == "cpu"
    assert GenaiBuild.resolve_for_target({"execution_provider": None}, gpu)["execution_provider"] == "cuda"
    assert GenaiBuild.resolve_for_target({"execution_provider": "cpu"}, gpu)["execution_provider"] == "cpu"


def test_quantization_options_do_not_split_float_builds() -> None:
    float_config = GenaiBuild.resolve_for_target({"precision": "fp32", "block_size": 128, "accuracy_level": 4}, None)
    assert float_config == {"precision": "fp32", "block_size": 32, "accuracy_level": None, "execution_provider": "cpu"}
    int4_config = GenaiBuild.resolve_for_target({"precision": "int4", "block_size": 128}, None)
    assert int4_config == {"precision": "int4", "block_size": 128, "execution_provider": "cpu"}


def test_the_builders_output_goes_to_its_log_in_the_workdir(fp32: PassResult) -> None:
    work = fp32.model.path.parent / "work-fp32"  # tests/genai_models.py: root/work-fp32 and root/fp32
    assert "Saving GenAI config" in (work / "builder.log").read_text()


def test_a_refused_build_prints_nothing(llama: ModelArtifact, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    capfd.readouterr()
    with pytest.raises(PassError):
        run_pass(GenaiBuild, llama, tmp_path, precision="bf16")
    assert capfd.readouterr() == ("", "")


def _workflow(folder: Path, second: dict) -> dict:
    return {
        "version": 1,
        "name": "decoder",
        "input": {"format": "hf", "path": str(folder)},
        "targets": [{"id": "cpu", "runtime": "onnxruntime"}],
        "steps": [{"id": "build", "pass": "genai_build"}, {"id": "second", "after": "build", **second}],
        "evaluate": [{"id": "size", "evaluator": "size"}],
        "select": {"objective": {"metric": "size.weights_bytes", "goal": "min"}},
    }


def test_validation_follows_the_genai_format_through_a_pass_that_keeps_it(llama: ModelArtifact, tmp_path: Path) -> None:
    import yaml

    from engine.core.errors import InputError
    from engine.workflow import load_workflow

    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(_workflow(llama.path, {"pass": "int4_weights"})))
    assert list(load_workflow(path).steps) == ["build", "second"]

    # int4_weights keeps genai, so what comes after it must take genai too
    refused = _workflow(llama.path, {"pass": "int4_weights", "optional": True})
    refused["steps"].append({"id": "ov", "pass": "openvino_convert", "after": "second"})
    path.write_text(yaml.safe_dump(refused))
    with pytest.raises(InputError) as caught:
        load_workflow(path)
    (problem,) = caught.value.problems
    assert problem.where == "steps[2].pass"
    assert "pass 'openvino_convert' cannot take a genai model (from step 'second')" in problem.message


def test_the_planner_follows_the_kept_format_to_the_target(llama: ModelArtifact, tmp_path: Path) -> None:
    import yaml

    from engine.plan.planner import build_plan
    from engine.workflow import load_workflow

    workflow = _workflow(llama.path, {"pass": "int4_weights"})
    workflow["targets"] = [{"id": "ov", "runtime": "openvino"}]  # runs onnx and openvino models, not genai folders
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(workflow))
    plan = build_plan(load_workflow(path))
    assert not plan.candidates
    assert any("ends in a genai model" in note and "second" in note for note in plan.dropped)


def _build(hf: Path, out: Path, lean: bool, *options: str) -> str:
    """Run the pass's builder script as genai_build does; its log."""
    import os
    import subprocess
    import sys

    from passes.generate import genai_build

    script = Path(genai_build.__file__).with_name("_builder_run.py")
    precision, *extra = options
    command = [sys.executable, str(script), "-i", str(hf), "-o", str(out), "-p", precision, "-e", "cpu", "-c", str(out.parent / "cache")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "KILN_BUILDER_LEAN": "1" if lean else "0"}
    done = subprocess.run([*command, "--extra_options", "hf_token=false", *extra], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_the_lean_quantization_writes_the_builders_own_files(llama: ModelArtifact, tmp_path: Path) -> None:
    # node by node (peak memory about the checkpoint's size, not 2.6x) and byte for byte the builder's whole-model quantization
    # (int8 and int4 block 128 checked so on the 0.7 B decoder: docs/benchmarks.md)
    options = ("int4", "block_size=16", "is_symmetric=false", "accuracy_level=4", "op_types_to_quantize=MatMul/Gather")
    own = _build(llama.path, tmp_path / "own" / "out", False, *options)
    lean = _build(llama.path, tmp_path / "lean" / "out", True, *options)
    assert "Kiln's lean to_nbits" in lean and "Kiln's lean to_nbits" not in own
    for name in ("model.onnx", "model.onnx.data", "genai_config.json"):
        assert (tmp_path / "lean" / "out" / name).read_bytes() == (tmp_path / "own" / "out" / name).read_bytes(), name


def test_the_builders_own_quantization_runs_where_the_lean_one_would_differ(llama: ModelArtifact, tmp_path: Path) -> None:
    # k_quant picks per-node settings over the whole model: the builder's own to_nbits, which still quantizes every MatMul
    log = _build(llama.path, tmp_path / "out", True, "int4", "block_size=32", "algo_config=k_quant")
    assert "Kiln's lean to_nbits" not in log
    import onnx

    ops = {node.op_type for node in onnx.load(tmp_path / "out" / "model.onnx", load_external_data=False).graph.node}
    assert "MatMulNBits" in ops and "MatMul" not in ops
