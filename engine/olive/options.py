"""The values, defaults and refusals of Olive's pass options (olive-ai 0.13) that the pass table uses:
how Olive spells a value and how Kiln does, what Olive does when an option is left out, and why an
option Kiln has no equivalent for is not carried over."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

NEVER_RUN = "user code Kiln would have to run; it is never run silently"

Option = str | tuple[str, Callable[[Any], Any]]

#: Olive's quantization data types (its Precision enum, onnxruntime's QuantType names, and the
#: older lower-case spellings) as onnxruntime's QuantType, lower-cased: Kiln's spelling
QUANT_TYPES = {
    "int8": "qint8",
    "uint8": "quint8",
    "int16": "qint16",
    "uint16": "quint16",
    "int4": "qint4",
    "uint4": "quint4",
    "qint8": "qint8",
    "quint8": "quint8",
    "qint16": "qint16",
    "quint16": "quint16",
    "qint4": "qint4",
    "quint4": "quint4",
    "qfloat8e4m3fn": "qfloat8e4m3fn",
}
#: Olive's Precision values ModelBuilder takes (olive.passes.onnx.model_builder: anything else is refused)
BUILDER_PRECISIONS = ("fp32", "fp16", "bf16", "int8", "int4")


def lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


def qtype(value: Any) -> Any:
    """int8 / QInt8 / qint8 → qint8, uint16 → quint16, ...: onnxruntime's QuantType, as Kiln spells it."""
    return QUANT_TYPES.get(str(value).lower(), lower(value)) if isinstance(value, str) else value


def algorithm(value: Any) -> Any:
    return "rtn" if value in (None, "DEFAULT", "default", "RTN") else lower(value)


def weight_overrides(value: Any) -> Any:
    """Olive's per-node weight config (``{node: {bits, group_size}}``) as int4_weights' overrides
    (``{node: {bits, block_size}}``)."""
    if not isinstance(value, dict):
        return value
    return {
        node: {("block_size" if k == "group_size" else k): v for k, v in spec.items()} if isinstance(spec, dict) else spec
        for node, spec in value.items()
    }


def _is_embedding(name: str) -> bool:
    return "embed_tokens" in name or name.rstrip("*$").endswith(("wte", "embed_in", "embeddings"))


def torch_overrides(value: Any) -> Any:
    """Olive's per-module overrides of its PyTorch quantizers (``{name | re:<regex>: {bits,
    symmetric, group_size}}``) as Kiln's (``sym`` for ``symmetric``); an embedding's entry is left
    out: the model builder reads an Olive checkpoint's embeddings in float (``embeds`` says why)."""
    if not isinstance(value, dict):
        return value
    out = {}
    for name, spec in value.items():
        if _is_embedding(str(name)):
            continue
        out[name] = {("sym" if k == "symmetric" else k): v for k, v in spec.items()} if isinstance(spec, dict) else spec
    return out


def gptqmodel_dynamic(value: Any) -> Any:
    """GPTQModel's ``dynamic`` (``{"+:<regex>": {bits, sym, group_size, ...}}``: a positive match
    gets these options; ``-:<regex>`` skips the module) as Kiln's overrides (``re:<regex>``); a
    skip stays a float module (bits 16 is not a Kiln override: such entries are left out)."""
    if not isinstance(value, dict):
        return value
    out = {}
    for pattern, spec in value.items():
        text = str(pattern)
        if text.startswith("-:") or not isinstance(spec, dict):
            continue
        regex = text[2:] if text.startswith("+:") else text
        if _is_embedding(regex):
            continue
        out[f"re:{regex}"] = {k: v for k, v in spec.items() if k in ("bits", "sym", "group_size")}
    return out


def quant_extra_options(value: Any) -> Any:
    """onnxruntime's quantizer extra options as Kiln's ort_quantize takes them: CalibStridedMinMax
    (MinMax calibration in strides of N samples, to bound memory; the same ranges) is dropped, as
    Kiln's calibration refuses it in favour of CalibMaxIntermediateOutputs."""
    if not isinstance(value, dict):
        return value
    return {k: v for k, v in value.items() if k != "CalibStridedMinMax"} or None


def keep_io_types(value: Any) -> Any:
    """Olive's fp16 keep_io_types is a bool or a list of input/output names; Kiln's is a bool: a list keeps them all."""
    return bool(value) if isinstance(value, list) else value


#: how Olive writes an ONNX output; Kiln writes weights over ~1.8 GB as external data by itself
EXTERNAL_DATA = ("save_as_external_data", "all_tensors_to_one_file", "external_data_name", "size_threshold", "convert_attribute")

#: Olive's PyTorch weight quantizers (olive/passes/pytorch/quant_utils.py get_quantizer_config) → Kiln's torch_quant passes
TORCH_QUANT: dict[str, Option] = {
    "bits": "bits",
    "group_size": "group_size",
    "sym": "sym",
    "lm_head": "lm_head",
    "modules_to_not_convert": "modules_to_not_convert",
}
TORCH_QUANT_DEFAULTS = {
    "bits": 4,
    "group_size": 128,
    "sym": False,
    "lm_head": False,
    "quantize_vision": False,
    "embeds": False,
    "moe": False,
    "modules_to_not_convert": None,
    "overrides": None,
}
TORCH_QUANT_DROPPED = {
    "embeds": "the model builder reads an Olive-format checkpoint's embeddings in float, so Kiln leaves them float "
    "(genai_build quantizes the Gather with op_types_to_quantize: [MatMul, Gather])",
    "quantize_vision": "Kiln's torch_quant passes quantize a decoder's layers; a vision tower stays float",
    "moe": "Kiln's torch_quant passes leave mixture-of-experts modules float",
    "moe_fallback_threshold": "Kiln's torch_quant passes leave mixture-of-experts modules float",
    "moe_fallback_min_k_multiple": "Kiln's torch_quant passes leave mixture-of-experts modules float",
    "device": "Kiln quantizes on the CPU",
    "static_groups": "Kiln's gptq always takes each group's scale from the original weights with act order (static groups)",
    "true_sequential": "Kiln's gptq quantizes a layer's modules in order, each on the inputs the earlier ones leave",
    "damp_auto_increment": "Kiln's gptq raises the dampening by itself when a Cholesky factor fails",
    "mse": "Kiln's gptq takes each group's scale from its min and max (no MSE search)",
    "rotation": "add a quarot step before gptq for the rotation",
    "layers_block_name": "Kiln finds the decoder layers of the model by itself",
    "outside_layer_modules": "Kiln finds the decoder layers of the model by itself",
    "inside_layer_modules": "Kiln finds the decoder layers of the model by itself",
}

QUANT_OPTIONS: dict[str, Option] = {
    "quant_mode": "mode",
    "precision": ("weight_type", qtype),  # Olive 0.13's name for the weights' type
    "weight_type": ("weight_type", qtype),  # its name before
    "activation_type": ("activation_type", qtype),
    "per_channel": "per_channel",
    "reduce_range": "reduce_range",
    "quant_format": "quant_format",
    "calibrate_method": "calibration_method",
    "op_types_to_quantize": "op_types_to_quantize",
    "nodes_to_quantize": "nodes_to_quantize",
    "nodes_to_exclude": "nodes_to_exclude",
    "extra_options": ("extra_options", quant_extra_options),
    "quant_preprocess": "preprocess",
    "weight_symmetric": "symmetric_weight",
    "activation_symmetric": "symmetric_activation",
    "WeightSymmetric": "symmetric_weight",
    "ActivationSymmetric": "symmetric_activation",
}
# olive-ai 0.13 (olive/passes/onnx/quantization.py): int8 weights and activations, QDQ, MinMax
QUANT_DEFAULTS: dict[str, Any] = {
    "precision": "int8",
    "weight_type": "QInt8",
    "activation_type": "int8",
    "per_channel": False,
    "reduce_range": False,
    "quant_preprocess": True,
    "nodes_to_exclude": None,
    "nodes_to_quantize": None,
    "op_types_to_quantize": None,
    "op_types_to_exclude": None,
    "extra_options": None,
    "calibration_providers": None,
    "activation_symmetric": False,
    "weight_symmetric": None,
    "min_real_range": None,
    "tensor_quant_overrides": None,
    "prepare_qdq_config": True,
    "quant_format": "QDQ",
    "calibrate_method": "MinMax",
}
QUANT_DROPPED = {
    "op_types_to_exclude": "Kiln's ort_quantize names the op types to quantize (op_types_to_quantize) or the nodes to keep "
    "in float (nodes_to_exclude); Olive turns this list into node names by reading the model: list those nodes",
    "calibration_providers": "Kiln calibrates with ONNX Runtime's CPU provider",
    "min_real_range": "no option of Kiln's ort_quantize for it: pass it as extra_options.MinimumRealRange",
    "tensor_quant_overrides": "no option of Kiln's ort_quantize for it: pass it as extra_options.TensorQuantOverrides",
    "prepare_qdq_config": "Kiln's ort_quantize always quantizes with onnxruntime's full-integer QDQ settings",
}
STATIC = frozenset({"quant_format", "calibration_method", "activation_type", "calibration", "symmetric_activation"})
INT4: dict[str, Option] = {
    "block_size": "block_size",
    "is_symmetric": "is_symmetric",
    "accuracy_level": "accuracy_level",
    "nodes_to_exclude": "nodes_to_exclude",
    "algorithm": ("algorithm", algorithm),
    "bits": "bits",
}
INT4_DROPPED = {
    "axis": "Kiln's int4_weights quantizes blocks along the reduction axis (Olive's axis 0)",
    "nodes_to_include": "Kiln's int4_weights quantizes every node of its op types but those in nodes_to_exclude",
    "op_types_to_quantize": "Kiln's int4_weights takes op types MatMul and Gather (op_types)",
}
# olive-ai 0.13 (olive/passes/onnx/rtn_quantization.py, hqq_quantization.py): 128-weight blocks, MatMul and Gather
BLOCKWISE = {
    "block_size": 128,
    "is_symmetric": True,
    "accuracy_level": 0,
    "bits": 4,
    "axis": 0,
    "nodes_to_exclude": None,
    "nodes_to_include": None,
}
INC_OPTIONS: dict[str, Option] = {
    "approach": "mode",
    "quant_format": "quant_format",
    "domain": "domain",
    "reduce_range": "reduce_range",
    "calibration_sampling_size": ("calibration_samples", lambda v: int(v[0] if isinstance(v, list) else v)),
    "op_types_to_exclude": "op_types_to_exclude",
    "nodes_to_exclude": "nodes_to_exclude",
}
# olive-ai 0.13 (olive/passes/onnx/inc_quantization.py)
INC_DEFAULTS: dict[str, Any] = {
    "device": "cpu",
    "backend": "default",
    "domain": "auto",
    "workspace": None,
    "recipes": {},
    "reduce_range": False,
    "quant_level": "auto",
    "excluded_precisions": [],
    "tuning_criterion": {},
    "metric": None,
    "weight_only_config": {},
    "op_type_dict": {},
    "quant_format": "QOperator",
    "calibration_sampling_size": [100],
}
INC_DROPPED = {
    "device": "Kiln's INC passes quantize on the CPU; the target runs the model where it is meant to",
    "backend": "Kiln's INC passes use INC's default ONNX Runtime backend",
    "workspace": "Kiln keeps INC's working files in the job's folder",
    "excluded_precisions": "Kiln's INC passes quantize to INT8 with FP32 fallback only",
    "op_type_dict": "no option of Kiln's INC passes for it: use op_types_to_exclude or nodes_to_exclude",
    "quant_level": "Kiln's inc_quantize_accuracy has quant_level; inc_quantize has none",
}
NO_INC_WEIGHT_ONLY = (
    "approach weight_only is INC's weight-only (INT4) quantization; Kiln's INC passes quantize to INT8: "
    "int4_weights (algorithm rtn or gptq) quantizes weights to 4 bits"
)
METADATA_ONLY = (
    "metadata_only: Olive writes only genai_config.json for an ONNX model it is given; Kiln's genai_build builds the "
    "whole genai folder from the Hugging Face model"
)
BUILDER_DROPPED = {
    "int4_algo_config": "Kiln's genai_build quantizes with default, rtn or k_quant (algo_config)",
    "int4_nodes_to_exclude": "no option of Kiln's genai_build for it",
    "use_qdq": "Kiln's genai_build writes MatMulNBits, not QDQ",
    "use_8bits_moe": "no option of Kiln's genai_build for it",
    "use_webgpu_fp32": "Kiln's genai_build builds for cpu, cuda or dml",
    "use_cuda_bf16": "no option of Kiln's genai_build for it",
    "include_hidden_states": "no option of Kiln's genai_build for it",
    "exclude_embeds": "no option of Kiln's genai_build for it",
    "exclude_lm_head": "no option of Kiln's genai_build for it",
    "enable_cuda_graph": "no option of Kiln's genai_build for it (ONNX Runtime GenAI's genai_config.json sets it)",
    "extra_options": "the model builder's extra options are not passed by Kiln's genai_build",
    "search": "Kiln's genai_build keeps the builder's generation defaults in genai_config.json",
}
GENAI_ALGOS = {"default": "default", "rtn": "rtn", "k_quant": "k_quant"}
EP_CONTEXT_DROPPED = {
    "weight_sharing": "Kiln's ort_compile compiles one model at a time: blobs are not shared between models",
    "provider_options": "Kiln's ort_compile compiles with the target's provider options: set them on the target",
    "session_options": "Kiln's ort_compile sets graph_optimization_level only",
    "disable_cpu_fallback": "Kiln's ort_compile leaves the nodes the provider does not take to the CPU provider",
}


def builder_precision(value: Any) -> str | None:
    """Why a ModelBuilder precision is not carried over (None when Kiln's genai_build takes it)."""
    if str(value).lower() in BUILDER_PRECISIONS:
        return None
    return f"{value!r} is not a precision of Olive's ModelBuilder ({', '.join(BUILDER_PRECISIONS)}): Olive refuses it too"


def genai_algo(value: Any) -> str | None:
    """Kiln's genai_build algo_config for Olive's int4_algo_config, or None when it has none."""
    return GENAI_ALGOS.get(str(value).lower())
