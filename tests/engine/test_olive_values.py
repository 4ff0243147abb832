"""How Olive's recipes spell things, and what the translation makes of them: model types and pass types
in any case, Hub ids, a PyTorchModel's loader and io_config read from its script, Olive 0.13's value
spellings and defaults, the passes Kiln has under other names (INC, EP context, HQQ), a chain that
branches where a Kiln pass cannot take the model before it, and values Kiln refuses, listed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.olive.importer import Translation, is_olive_config, translate

CPU = {"local": {"type": "LocalSystem", "accelerators": [{"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}]}}
SCRIPT = '''
def load_vision(model_name):
    return None


def vision_io(model=None):
    """Read, not run."""
    return {"input_names": ["pixel_values"], "input_shapes": [[1, 3, 8, 8]], "output_names": ["features"]}


def computed_io(model=None):
    names = ["a"]
    return {"input_names": names}
'''


def run(tmp: Path, passes: dict[str, Any], **rest: Any) -> Translation:
    config = {"input_model": {"type": "ONNXModel", "model_path": "model.onnx"}, "systems": CPU, "passes": passes, **rest}
    assert is_olive_config(config)
    (tmp / "script.py").write_text(SCRIPT)
    return translate(config, tmp / "olive.json")


def steps(t: Translation) -> list[tuple[str, str, dict[str, Any]]]:
    return [(s["id"], s["pass"], s.get("config", {})) for s in t.workflow["steps"]]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ({"type": "HFModel", "model_path": "Qwen/Qwen2.5-1.5B-Instruct"}, {"format": "hf", "model": "Qwen/Qwen2.5-1.5B-Instruct"}),
        ({"model_path": "openai/whisper-large-v3-turbo"}, {"format": "hf", "model": "openai/whisper-large-v3-turbo"}),  # untyped
        ({"type": "PyTorchModel", "model_path": "org/net"}, {"format": "hf", "model": "org/net"}),  # no loader: a Hub model
        ({"type": "onnxmodel", "model_path": "models", "onnx_file_name": "m.onnx"}, {"format": "onnx", "path": "models/m.onnx"}),
        (
            {"type": "HfModel", "model_path": "org/name", "task": "text-generation-with-past", "load_kwargs": {"trust_remote_code": True}},
            {"format": "hf", "model": "org/name", "task": "text-generation", "trust_remote_code": True},
        ),
    ],
)
def test_input_model_forms(tmp_path, model, expected):
    t = run(tmp_path, {}, input_model=model)
    assert t.workflow["input"] == expected
    assert not [w for w, _ in t.unmapped if w.startswith("input_model")]


def test_a_pytorch_model_gets_its_loader_parameter_and_a_literal_io_config(tmp_path):
    model = {
        "type": "PytorchModel",
        "model_path": "org/vision",
        "model_script": "script.py",
        "model_loader": "load_vision",
        "io_config": "vision_io",
        "dummy_inputs_func": "dummies",
    }
    t = run(tmp_path, {"c": {"type": "onnxconversion"}}, input_model=model)
    assert t.workflow["input"] == {"format": "torch", "factory": "script.py:load_vision", "kwargs": {"model_name": "org/vision"}}
    assert steps(t) == [("c", "torch_export", {"input_shapes": {"pixel_values": [1, 3, 8, 8]}, "outputs": ["features"], "opset": 20})]
    assert [w for w, _ in t.unmapped] == ["input_model.dummy_inputs_func"]
    computed = run(tmp_path, {}, input_model={**model, "io_config": "computed_io"})
    assert "made by computed_io() in script.py" in dict(computed.unmapped)["input_model.io_config"]


@pytest.mark.parametrize(
    ("model", "where", "says"),
    [
        ({"type": "OpenVINOModel", "model_path": "ov"}, "input_model.type", "Kiln's inputs are hf, onnx and torch"),
        ({"type": "CompositeModel", "model_components": []}, "input_model.type", "several components"),
        ({"type": "azureml_registry_model", "name": "m"}, "input_model.type", "no Kiln input for Olive's azureml_registry_model"),
        ({"type": "HfModel", "model_path": {"type": "azureml_model"}}, "input_model.model_path", "AzureML or registry reference"),
        ({"type": "HfModel", "model_path": "<MODEL_PATH>"}, "input_model.model_path", "neither a folder here nor a Hugging Face Hub id"),
    ],
)
def test_an_input_kiln_has_none_for_is_listed_with_why(tmp_path, model, where, says):
    assert says in dict(run(tmp_path, {}, input_model=model).unmapped)[where]


def test_olive_value_spellings_and_defaults(tmp_path):
    t = run(
        tmp_path,
        {
            "s": {"type": "ONNXSTATICQUANTIZATION", "precision": "uint8", "activation_type": "int8", "calibrate_method": "MinMax"},
            "d": {"type": "OnnxDynamicQuantization", "precision": "QInt8", "weight_symmetric": True},
            "q16": {"type": "OnnxStaticQuantization", "activation_type": "uint16"},
            "fp16": {"type": "OnnxFloatToFloat16", "keep_io_types": ["logits"]},
            "hqq": {"type": "OnnxHqqQuantization"},
        },
    )
    assert steps(t) == [
        ("s", "ort_quantize", {"mode": "static", "activation_type": "qint8", "weight_type": "quint8", "calibration": "calibration"}),
        ("d", "ort_quantize", {"mode": "dynamic", "symmetric_weight": True}),
        ("q16", "ort_quantize", {"mode": "static", "activation_type": "quint16", "calibration": "calibration"}),
        ("fp16", "fp16", {"min_positive_val": 1e-7, "max_finite_val": 1e4, "keep_io_types": True}),
        ("hqq", "int4_weights", {"algorithm": "hqq", "block_size": 128}),
    ]
    assert "passes.q16.activation_type" not in dict(t.unmapped)  # 16-bit activations: static QDQ takes them
    assert any("Olive keeps only logits in float32" in n for n in t.notes)


def test_model_builder_values(tmp_path):
    builder = {
        "type": "modelbuilder",
        "precision": "int4",
        "int4_op_types_to_quantize": ["MatMul", "Gemm"],
        "int4_algo_config": "k_quant_mixed",
        "extra_options": {"int4_accuracy_level": 4, "filename": "text.onnx", "prune_lm_head": True},
    }
    t = run(
        tmp_path, {"mb": builder, "bad": {"type": "ModelBuilder", "precision": "int"}}, input_model={"type": "HfModel", "model_path": "o/m"}
    )
    assert steps(t) == [("mb", "genai_build", {"precision": "int4", "accuracy_level": 4}), ("bad", "genai_build", {})]
    listed = dict(t.unmapped)
    assert "Gemm" in listed["passes.mb.int4_op_types_to_quantize"]
    assert "'k_quant_mixed'" in listed["passes.mb.int4_algo_config"]
    assert "passes.mb.prune_lm_head" in listed
    assert "Olive refuses it too" in listed["passes.bad.precision"]
    meta = run(tmp_path, {"mb": {"type": "ModelBuilder", "precision": "int4", "metadata_only": True}})
    assert meta.workflow["steps"] == [] and "metadata_only" in dict(meta.unmapped)["passes.mb"]


def test_inc_passes_and_accuracy_driven_tuning(tmp_path):
    metric = {
        "name": "acc",
        "type": "accuracy",
        "sub_types": [{"name": "accuracy_score", "priority": 1, "goal": {"type": "percent-max-degradation", "value": 2}}],
    }
    t = run(
        tmp_path,
        {
            "dyn": {"type": "IncDynamicQuantization"},
            "tuned": {
                "type": "IncStaticQuantization",
                "metric": metric,
                "recipes": {"smooth_quant": True, "smooth_quant_args": {"alpha": 0.7}},
            },
            "woq": {"type": "IncQuantization", "approach": "weight_only"},
        },
    )
    assert steps(t) == [
        ("dyn", "inc_quantize", {"mode": "dynamic"}),
        (
            "tuned",
            "inc_quantize_accuracy",
            {
                "mode": "static",
                "smooth_quant": True,
                "smooth_quant_alpha": 0.7,
                "calibration": "calibration",
                "validation": "acc",
                "metric": "top1",
                "metric_goal": "max",
                "loss_type": "relative",
                "tolerable_loss": 0.02,
                "strategy": "basic",
                "max_trials": 5,
            },
        ),
    ]
    assert any(e["id"] == "acc" and e["evaluator"] == "accuracy" for e in t.workflow["evaluate"])
    assert "weight-only" in dict(t.unmapped)["passes.woq"]


def test_ep_context_and_a_branch_where_the_model_before_is_not_taken(tmp_path):
    t = run(
        tmp_path,
        {
            "convert": {"type": "OnnxConversion"},
            "ov": {"type": "OpenVINOConversion"},
            "fuse": {"type": "OrtTransformersOptimization", "model_type": "bert", "float16": True, "force_fp32_ops": ["Softmax"]},
            "ctx": {"type": "EPContextBinaryGenerator", "embed_context": True, "weight_sharing": True},
        },
        input_model={"type": "HfModel", "model_path": "org/bert", "task": "feature-extraction"},
    )
    assert [(s["id"], s["pass"], s.get("after")) for s in t.workflow["steps"]] == [
        ("convert", "torch_export", None),
        ("ov", "openvino_convert", "convert"),
        ("fuse", "ort_fusion", "convert"),  # Olive would hand it the OpenVINO model: Kiln takes the ONNX one
        ("fuse_fp16", "fp16", "fuse"),
        ("ctx", "ort_compile", "fuse_fp16"),
    ]
    assert t.workflow["steps"][3]["config"] == {"keep_io_types": True, "op_block_list": ["Softmax"]}
    assert t.workflow["steps"][4]["config"] == {"embed": True}
    assert "blobs are not shared" in dict(t.unmapped)["passes.ctx.weight_sharing"]
    assert any("a branch of the chain" in n for n in t.notes)


def test_passes_kiln_lacks_are_listed_by_family(tmp_path):
    t = run(tmp_path, {"s": {"type": "InputNCHWtoNHWC"}, "l": {"type": "LoRA"}, "x": {"type": "Nonesuch"}})
    listed = dict(t.unmapped)
    assert "static-shape NPU runtime" in listed["passes.s"] and "fine-tunes the model" in listed["passes.l"]
    assert listed["passes.x"] == "no Kiln pass for Olive's Nonesuch: the chain goes on without it"
