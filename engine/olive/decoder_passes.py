"""Olive's decoder and NPU passes → Kiln passes: PyTorch-level weight quantizers (rtn, gptq,
GptqModel, GptqQuantizer, SelectiveMixedPrecision, QuaRot, written as Olive-format checkpoints
the model builder reads), ONNX-level k-quant, the NPU graph work (DynamicToFixedShape,
MatMulNBitsToQDQ, AddOliveMetadata, CaptureSplitInfo / SplitModel) and static quantization with
QNN's rules. Entries as in ``engine.olive.passes``."""

from __future__ import annotations

from typing import Any

from engine.olive.options import (
    QUANT_DEFAULTS,
    QUANT_DROPPED,
    QUANT_OPTIONS,
    STATIC,
    TORCH_QUANT,
    TORCH_QUANT_DEFAULTS,
    TORCH_QUANT_DROPPED,
    gptqmodel_dynamic,
    torch_overrides,
    weight_overrides,
)
from engine.olive.spec import PassSpec

DECODER_PASSES: dict[str, PassSpec] = {
    "StaticLLM": PassSpec(
        "static_llm",
        {k: k for k in ("batch_size", "context_length", "prefill_decode_models", "group_session_options", "update_genai_config")},
        {"batch_size": 1, "context_length": 64, "prefill_decode_models": True, "group_session_options": None, "update_genai_config": False},
    ),
    "DynamicToFixedShape": PassSpec(
        "fixed_shape",
        {k: k for k in ("dim_param", "dim_value", "input_name", "input_shape")},
        {"dim_param": None, "dim_value": None, "input_name": None, "input_shape": None},
    ),
    "MatMulNBitsToQDQ": PassSpec(
        "nbits_to_qdq",
        {k: k for k in ("use_transpose_op", "use_int4", "use_signed_int", "add_zero_point", "nodes_to_exclude")},
        {"use_transpose_op": False, "use_int4": False, "use_signed_int": False, "add_zero_point": False, "nodes_to_exclude": None},
    ),
    "AddOliveMetadata": PassSpec(
        "add_metadata",
        {"graph_name": "graph_name", "custom_metadata": "metadata", "add_optimization_info": "lineage"},
        {"custom_metadata": {}, "add_optimization_info": True},
    ),
    # Olive's PyTorch weight quantizers: Kiln's torch_quant passes write the same (olive) checkpoint
    "rtn": PassSpec(
        "rtn",
        {**TORCH_QUANT, "overrides": ("overrides", torch_overrides)},
        TORCH_QUANT_DEFAULTS,
        dropped=TORCH_QUANT_DROPPED,
    ),
    "gptq": PassSpec(
        "gptq",
        {**TORCH_QUANT, "overrides": ("overrides", torch_overrides), "damp_percent": "damp_percent", "desc_act": "desc_act"},
        {
            **TORCH_QUANT_DEFAULTS,
            "damp_percent": 0.01,
            "desc_act": None,
            "moe_fallback_threshold": None,
            "moe_fallback_min_k_multiple": None,
        },
        data="calibration",
        dropped=TORCH_QUANT_DROPPED,
    ),
    # GPTQModel's defaults: one group per row, act order, symmetric, dampening 0.05
    "GptqModel": PassSpec(
        "gptq",
        {**TORCH_QUANT, "damp_percent": "damp_percent", "desc_act": "desc_act", "dynamic": ("overrides", gptqmodel_dynamic)},
        {
            "bits": 4,
            "group_size": -1,
            "damp_percent": 0.05,
            "damp_auto_increment": 0.01,
            "static_groups": False,
            "true_sequential": True,
            "desc_act": True,
            "sym": True,
            "mse": 0.0,
            "lm_head": False,
            "device": "cpu",
            "dynamic": None,
            "rotation": None,
        },
        {"group_size": -1, "sym": True, "damp_percent": 0.05, "desc_act": True},
        data="calibration",
        dropped=TORCH_QUANT_DROPPED,
    ),
    # AutoGPTQ through Olive's GptqQuantizer
    "GptqQuantizer": PassSpec(
        "gptq",
        {"bits": "bits", "group_size": "group_size", "sym": "sym", "damp_percent": "damp_percent", "desc_act": "desc_act"},
        {
            "bits": 4,
            "group_size": 128,
            "damp_percent": 0.01,
            "static_groups": False,
            "true_sequential": False,
            "desc_act": False,
            "sym": False,
            "layers_block_name": None,
            "outside_layer_modules": None,
            "inside_layer_modules": None,
        },
        {"desc_act": False},
        data="calibration",
        dropped=TORCH_QUANT_DROPPED,
    ),
    # Olive's SelectiveMixedPrecision chooses the modules kept at high_bits and writes the choice
    # (mixed_precision_info) into the checkpoint for the rtn / gptq step after it: so does Kiln's
    "SelectiveMixedPrecision": PassSpec(
        "selective_mixed_precision",
        {k: k for k in ("algorithm", "bits", "high_bits", "ratio", "group_size", "sym", "high_group_size", "high_sym")},
        {
            "bits": 4,
            "group_size": 128,
            "sym": False,
            "high_bits": 8,
            "high_group_size": None,
            "high_sym": None,
            "ratio": None,
            "kld_memory_mode": "auto",
        },
        data="calibration",
        dropped={"kld_memory_mode": "Kiln scores on the CPU, in one memory mode"},
    ),
    # Olive's QuaRot rotates and writes a float checkpoint; the gptq or rtn step after it quantizes
    "QuaRot": PassSpec(
        "quarot", {"seed": "seed", "rotate_mode": "rotate_mode"}, {"seed": 0, "rotate_mode": "hadamard"}, {"method": "none"}
    ),
    # olive-ai's OnnxKQuantQuantization: k-quant scales over 32-weight blocks, MatMul only
    "OnnxKQuantQuantization": PassSpec(
        "int4_weights",
        {
            "bits": "bits",
            "block_size": "block_size",
            "accuracy_level": ("accuracy_level", lambda v: None if v in (None, 0, "unset") else v),
            "customized_weight_config": ("overrides", weight_overrides),
            "nodes_to_exclude": "nodes_to_exclude",
        },
        {"bits": 4, "block_size": 32, "accuracy_level": None, "customized_weight_config": None, "nodes_to_exclude": None},
        {"algorithm": "k_quant", "block_size": 32},
    ),
}


#: OnnxStaticQuantization where the target runs QNN's provider: Olive then quantizes with
#: onnxruntime's QNN rules (get_qnn_qdq_config), as Kiln's qnn_quantize does
QNN_STATIC = PassSpec(
    "qnn_quantize",
    {**QUANT_OPTIONS, "op_types_to_exclude": "op_types_to_exclude"},
    {**QUANT_DEFAULTS, "quant_mode": "static", "activation_type": "uint16", "precision": "uint8", "weight_type": "QUInt8"},
    {"mode": "static"},
    "calibration",
    STATIC,
    dropped={k: v for k, v in QUANT_DROPPED.items() if k != "op_types_to_exclude"},
)

#: Olive's CaptureSplitInfo options Kiln's split_model takes; the others and why not
SPLIT_OPTIONS = ("num_splits", "unique_embeds_lm_head_splits")
SPLIT_DROPPED = {
    "cost_model": "Kiln's split_model splits by a weight budget in bytes (max_part_bytes), not by Olive's cost-model CSV",
    "block_to_split": "Kiln's split_model finds the layers from the node names (layers.<i>)",
}


def capture_split_info(olive: dict[str, Any], where: str, ctx: Any) -> dict[str, Any]:
    """Olive's CaptureSplitInfo annotates the model with how to split it; the SplitModel step later
    splits it. Kiln's split_model takes the same options where that SplitModel runs."""
    found = {k: olive[k] for k in SPLIT_OPTIONS if olive.get(k) is not None}
    for key, why in SPLIT_DROPPED.items():
        if olive.get(key) is not None:
            ctx.skip(f"{where}.{key}", why)
    ctx.notes.append(f"{where}: the split it records ({found or 'none'}) is made by the split_model step SplitModel becomes")
    return found


def split_spec(info: dict[str, Any] | None) -> PassSpec:
    """Olive's SplitModel as Kiln's split_model, with what the CaptureSplitInfo before it recorded."""
    if not info or "num_splits" not in info:
        return PassSpec(
            None, reason="Olive's SplitModel splits where a CaptureSplitInfo before it said; none did: give split_model num_splits"
        )
    return PassSpec("split_model", fixed=dict(info))
