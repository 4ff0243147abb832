"""Olive's AMD Quark passes: on an ONNX model both are Kiln's quark_quantize (Quark's ONNX path,
with the Vitis AI variant's activation defaults written out), their global_config, algo_config
and extra_options carried over; on a Hugging Face model (Quark's torch path, the LLM recipes) they
are listed with why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.olive.importer import Translation, translate

CPU = {"local": {"type": "LocalSystem", "accelerators": [{"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}]}}
ONNX_INPUT = {"type": "ONNXModel", "model_path": "model.onnx"}
HF_INPUT = {"type": "HfModel", "model_path": "Qwen/Qwen2.5-1.5B-Instruct"}
#: the one ONNX-path recipe's pass (timm-mobilenetv3_small_100.lamb_in1k/VitisAI)
NPU_CNN = {
    "type": "QuarkQuantization",
    "data_config": "calib_data",
    "global_config": {
        "activation": {"symmetric": True, "calibration_method": "Percentile", "quant_granularity": "Tensor", "data_type": "UInt8"},
        "weight": {"symmetric": True, "calibration_method": "MinMax", "quant_granularity": "Tensor", "data_type": "Int8"},
    },
    "algo_config": [
        {"name": "cle", "cle_steps": 6},
        {"name": "adaquant", "batch_size": 1, "num_iterations": 1000, "learning_rate": 1e-5, "early_stop": True},
    ],
    "extra_options": {"EnableNPUCnn": True},
}
#: the LLM recipes' pass (followed by the Ryzen AI model generator)
LLM = {"type": "QuarkQuantization", "quant_scheme": "uint4_wo_128", "quant_algo": "awq", "dataset": "pileval_for_awq_benchmark"}


def run(tmp: Path, passes: dict[str, Any], model: dict[str, Any] = ONNX_INPUT) -> Translation:
    return translate({"input_model": model, "systems": CPU, "passes": passes}, tmp / "olive.json")


def step(t: Translation, index: int = 0) -> tuple[str, dict[str, Any]]:
    found = t.workflow["steps"][index]
    return found["pass"], found.get("config", {})


def test_the_onnx_path_is_quark_quantize_with_every_option(tmp_path: Path) -> None:
    t = run(tmp_path, {"quantization": NPU_CNN})
    kiln, config = step(t)
    assert kiln == "quark_quantize"
    assert config["calibration"] == "calib_data"
    assert config["activation"] == NPU_CNN["global_config"]["activation"]
    assert config["weight"] == NPU_CNN["global_config"]["weight"]
    assert config["algorithms"] == NPU_CNN["algo_config"]
    assert config["extra_options"] == {"EnableNPUCnn": True}
    assert not [where for where, _ in t.unmapped if where.startswith("passes.")], t.unmapped


def test_the_vitis_ai_variant_starts_activations_from_uint8_asymmetric(tmp_path: Path) -> None:
    plain = step(run(tmp_path, {"q": {"type": "QuarkQuantizationVitisAI"}}))[1]
    assert plain["activation"] == {"data_type": "UInt8", "symmetric": False}
    assert plain["calibration"]  # a stand-in where Olive would use random data
    given = {"type": "QuarkQuantizationVitisAI", "global_config": {"activation": {"data_type": "XInt8"}, "weight": {"symmetric": False}}}
    config = step(run(tmp_path, {"q": given}))[1]
    assert config["activation"] == {"data_type": "Int8", "symmetric": False}  # set_data_type keeps UInt8Spec's symmetry
    assert config["weight"] == {"symmetric": False}


def test_what_quark_does_not_read_or_kiln_does_not_take_is_listed(tmp_path: Path) -> None:
    olive = {
        "type": "QuarkQuantization",
        "quant_format": "QOperator",
        "global_config": {"activation": {"data_type": "MX4", "symmetric": True}, "bias": {"data_type": "Int32"}},
        "algo_config": [{"name": "magic"}, {"name": "cle", "cle_steps": 2, "verbose": True}],
        "layer_type_config": [[{"weight": {"data_type": "Int16"}}, ["Conv"]]],
        "exclude": ["/conv1/Conv"],
    }
    t = run(tmp_path, {"q": olive})
    _, config = step(t)
    assert config["activation"] == {"symmetric": True} and config["algorithms"] == [{"name": "cle", "cle_steps": 2}]
    assert config["exclude"] == ["/conv1/Conv"]
    listed = dict(t.unmapped)
    assert set(listed) == {
        "passes.q.quant_format",
        "passes.q.global_config.activation.data_type",
        "passes.q.global_config.bias",
        "passes.q.algo_config[0]",
        "passes.q.algo_config[1].verbose",
        "passes.q.layer_type_config",
    }, listed
    assert "QDQ" in listed["passes.q.quant_format"]


def test_the_torch_path_is_listed_with_why(tmp_path: Path) -> None:
    passes = {"quantize": LLM, "generate": {"type": "RyzenGenerateModelLLM"}}
    t = run(tmp_path, passes, model=HF_INPUT)
    assert not t.workflow.get("steps")
    listed = dict(t.unmapped)
    assert "torch path" in listed["passes.quantize"] and "quark_quantize" in listed["passes.quantize"]
    assert "Ryzen AI" in listed["passes.generate"]
    vitis = dict(run(tmp_path, {"q": {**LLM, "type": "QuarkQuantizationVitisAI"}}, model=HF_INPUT).unmapped)
    assert "torch path" in vitis["passes.q"]


def test_after_an_export_quark_quantizes_the_onnx_model(tmp_path: Path) -> None:
    passes = {"conversion": {"type": "OnnxConversion", "target_opset": 17}, "quantization": NPU_CNN}
    t = run(tmp_path, passes, model={"type": "HfModel", "model_path": "org/net", "task": "image-classification"})
    assert [s["pass"] for s in t.workflow["steps"]] == ["torch_export", "quark_quantize"]
    assert t.workflow["steps"][1]["after"] == t.workflow["steps"][0]["id"]
