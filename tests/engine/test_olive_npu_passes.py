"""Olive passes of the NPU and vendor recipes: the peephole optimizer as those recipes set it,
EP context binaries over a genai folder or split parts, Vitis AI's metadata, QNN's preprocessing,
and the vendor toolchains Kiln cannot run, each listed with the SDK it needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.olive.importer import Translation, translate

CPU = {"local": {"type": "LocalSystem", "accelerators": [{"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}]}}
ONNX_INPUT = {"type": "ONNXModel", "model_path": "model.onnx"}


def run(tmp: Path, passes: dict[str, Any], systems: dict[str, Any] | None = None, **rest: Any) -> Translation:
    config = {"input_model": ONNX_INPUT, "systems": systems or CPU, "passes": passes, **rest}
    return translate(config, tmp / "olive.json")


def steps(t: Translation) -> list[tuple[str, str, dict[str, Any]]]:
    return [(s["id"], s["pass"], s.get("config", {})) for s in t.workflow["steps"]]


def test_the_peephole_optimizer_with_onnxoptimizer_off_is_onnx_peephole(tmp_path: Path) -> None:
    off = {"onnxscript_optimize": False, "onnxoptimizer_optimize": False, "fuse_reshape_operations": False}
    fixes = {"fix_com_microsoft_opset": True, "cast_chain_elimination": True}
    t = run(tmp_path, {"p": {"type": "OnnxPeepholeOptimizer", **off, **fixes}, "d": {"type": "OnnxPeepholeOptimizer"}})
    assert steps(t) == [
        ("p", "onnx_peephole", {"onnxscript_optimize": False, "fuse_reshape_operations": False, **fixes}),
        ("d", "onnx_simplify", {}),  # with onnxoptimizer on, onnxslim is the nearest
    ]
    assert not [where for where, _ in t.unmapped if where.startswith("passes.p")]


def test_vitis_ai_metadata_and_qnn_preprocessing(tmp_path: Path) -> None:
    vitis = {"type": "VitisAIAddMetaData", "config_meta_data_keys": ["architectures"], "activation_type": "uint16", "weight_type": "uint8"}
    t = run(tmp_path, {"pre": {"type": "QNNPreprocess", "fuse_layernorm": True}, "meta": vitis})
    assert steps(t) == [
        ("pre", "qnn_preprocess", {"fuse_layernorm": True}),
        (
            "meta",
            "add_metadata",
            {"lineage": False, "metadata": {"quant_type": "NA", "activation_dtype": "QUInt16", "weight_dtype": "QUInt8"}},
        ),
    ]
    assert [where for where, _ in t.unmapped] == ["passes.meta.config_meta_data_keys"]


def test_each_vendor_toolchain_names_the_sdk_it_needs(tmp_path: Path) -> None:
    kinds = [
        "VitisGenerateModelLLM",
        "RyzenGenerateModelLLM",
        "QairtPreparation",
        "NVModelOptQuantization",
        "AitkPython",
    ]
    listed = dict(run(tmp_path, {kind.lower(): {"type": kind} for kind in kinds}).unmapped)
    assert all("needs " in listed[f"passes.{kind.lower()}"] for kind in kinds), listed
    assert "Ryzen AI" in listed["passes.ryzengeneratemodelllm"]
    assert "QAIRT" in listed["passes.qairtpreparation"] and "ModelOpt" in listed["passes.nvmodeloptquantization"]
