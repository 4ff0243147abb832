"""Olive passes → Kiln steps: one table entry per Olive pass type.

An entry names the Kiln pass, how each Olive option carries over (a Kiln option name, or a name
and a function of the value), and Olive's defaults (an option left at its default is dropped
silently). An option neither mapped nor at its default is reported as not carried over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Option = str | tuple[str, Callable[[Any], Any]]

NO_INC = "Kiln has no Intel Neural Compressor pass here; ort_quantize (ONNX Runtime) or nncf_quantize (OpenVINO) quantize to INT8"


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


def _qtype(value: Any) -> Any:
    return {"QInt8": "qint8", "QUInt8": "quint8"}.get(value, _lower(value))


def _algorithm(value: Any) -> Any:
    return "rtn" if value in (None, "DEFAULT", "default", "RTN") else _lower(value)


@dataclass(frozen=True)
class PassSpec:
    kiln: str | None  # None: not carried over (``reason`` says why)
    options: dict[str, Option] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)
    data: str | None = None  # the Kiln option an Olive data_config goes to
    static_only: frozenset[str] = frozenset()
    reason: str = ""


_QUANT_OPTIONS: dict[str, Option] = {
    "quant_mode": "mode",
    "weight_type": ("weight_type", _qtype),
    "activation_type": ("activation_type", _qtype),
    "per_channel": "per_channel",
    "reduce_range": "reduce_range",
    "quant_format": "quant_format",
    "calibrate_method": "calibration_method",
    "op_types_to_quantize": "op_types_to_quantize",
    "nodes_to_quantize": "nodes_to_quantize",
    "nodes_to_exclude": "nodes_to_exclude",
    "extra_options": "extra_options",
    "quant_preprocess": "preprocess",
    "WeightSymmetric": "symmetric_weight",
    "ActivationSymmetric": "symmetric_activation",
}
_QUANT_DEFAULTS: dict[str, Any] = {
    "weight_type": "QInt8",
    "per_channel": False,
    "reduce_range": False,
    "quant_preprocess": True,
    "nodes_to_exclude": None,
    "nodes_to_quantize": None,
    "op_types_to_quantize": None,
    "extra_options": None,
    "calibration_providers": None,
    "save_as_external_data": False,
    "all_tensors_to_one_file": True,
    "external_data_name": None,
    "size_threshold": 1024,
    "convert_attribute": False,
}
_STATIC = frozenset({"quant_format", "calibration_method", "activation_type", "calibration", "symmetric_activation"})
_INT4: dict[str, Option] = {
    "block_size": "block_size",
    "is_symmetric": "is_symmetric",
    "accuracy_level": "accuracy_level",
    "nodes_to_exclude": "nodes_to_exclude",
    "algorithm": ("algorithm", _algorithm),
    "bits": "bits",
}
_INT4_DEFAULTS = {"block_size": 32, "is_symmetric": True, "accuracy_level": None, "nodes_to_exclude": None, "algorithm": None, "bits": 4}

PASSES: dict[str, PassSpec] = {
    "OnnxConversion": PassSpec(
        "torch_export",
        {
            "target_opset": "opset",
            "use_dynamo_exporter": ("exporter", lambda v: "dynamo" if v else "torchscript"),
            "dynamic": "dynamic_axes",
        },
        {
            "use_dynamo_exporter": False,
            "past_key_value_name": "past_key_values",
            "device": "cpu",
            "torch_dtype": None,
            "parallel_jobs": None,
            "merge_adapter_weights": False,
            "save_metadata_for_token_generation": False,
            "optimize": True,
            "dynamic": True,
            "save_as_external_data": False,
            "all_tensors_to_one_file": True,
            "external_data_name": None,
            "size_threshold": 1024,
            "convert_attribute": False,
        },
    ),
    "OrtTransformersOptimization": PassSpec(
        "ort_fusion",
        {
            "model_type": "model_type",
            "num_heads": "num_heads",
            "hidden_size": "hidden_size",
            "opt_level": "opt_level",
            "use_gpu": "use_gpu",
            "only_onnxruntime": "only_onnxruntime",
        },
        {
            "model_type": None,
            "num_heads": 0,
            "num_key_value_heads": 0,
            "hidden_size": 0,
            "optimization_options": None,
            "opt_level": None,
            "only_onnxruntime": False,
            "float16": False,
            "keep_io_types": True,
            "force_fp32_ops": None,
            "force_fp32_nodes": None,
            "force_fp16_inputs": None,
            "use_gqa": False,
            "input_int32": False,
            "save_as_external_data": False,
            "all_tensors_to_one_file": True,
        },
    ),
    "OnnxQuantization": PassSpec(
        "ort_quantize", _QUANT_OPTIONS, {**_QUANT_DEFAULTS, "quant_mode": "static"}, {"mode": "static"}, "calibration", _STATIC
    ),
    "OnnxDynamicQuantization": PassSpec(
        "ort_quantize", _QUANT_OPTIONS, {**_QUANT_DEFAULTS, "quant_mode": "dynamic", "quant_format": "QOperator"}, {"mode": "dynamic"}
    ),
    "OnnxStaticQuantization": PassSpec(
        "ort_quantize",
        _QUANT_OPTIONS,
        {**_QUANT_DEFAULTS, "quant_mode": "static", "quant_format": "QDQ", "calibrate_method": "MinMax", "activation_type": "QUInt8"},
        {"mode": "static"},
        "calibration",
        _STATIC,
    ),
    "OnnxMatMul4Quantizer": PassSpec("int4_weights", _INT4, _INT4_DEFAULTS),
    "OnnxBlockWiseRtnQuantization": PassSpec("int4_weights", _INT4, _INT4_DEFAULTS),
    "OnnxFloatToFloat16": PassSpec(
        "fp16",
        {
            "keep_io_types": "keep_io_types",
            "op_block_list": "op_block_list",
            "node_block_list": "node_block_list",
            "min_positive_val": "min_positive_val",
            "max_finite_val": "max_finite_val",
            "use_symbolic_shape_infer": "symbolic_shape_inference",
        },
        {
            "keep_io_types": False,
            "use_symbolic_shape_infer": True,
            "op_block_list": None,
            "op_include_list": None,
            "node_include_list": None,
        },
        {"min_positive_val": 1e-7, "max_finite_val": 1e4},  # Olive's clamps, not onnxruntime's
    ),
    # onnxslim folds constants, drops dead nodes and fuses patterns with standard ops: the nearest
    # to the onnxscript + onnxoptimizer rewrites Olive's peephole optimizer runs.
    "OnnxPeepholeOptimizer": PassSpec(
        "onnx_simplify",
        {},
        {
            "onnxscript_optimize": True,
            "onnxoptimizer_optimize": True,
            "fuse_reshape_operations": True,
            "fix_com_microsoft_opset": False,
            "cast_chain_elimination": False,
        },
    ),
    "OpenVINOConversion": PassSpec(
        "openvino_convert",
        {"compress_to_fp16": "compress_to_fp16"},
        {"model_name": "ov_model", "static": False, "extra_configs": None, "input_shapes": None, "example_input_func": None},
        {"compress_to_fp16": True},  # Olive's default; Kiln's is false
    ),
    "OpenVINOQuantization": PassSpec(
        "nncf_quantize",
        {"model_type": ("model_type", _lower), "preset": ("preset", _lower), "target_device": ("target_device", _upper)},
        {"model_type": None, "reuse_cache": False, "extra_configs": None, "transform_fn": None, "ignored_scope_type": None},
        {"preset": "performance"},  # Olive's default; Kiln's is mixed
        "calibration",
    ),
    "OpenVINOWeightCompression": PassSpec(
        "nncf_compress_weights",
        {"target_device": ("target_device", _upper)},
        {"reuse_cache": False, "extra_args": None, "transform_fn": None, "ignored_scope_type": None, "target_device": None},
        {},
        "dataset",
    ),
    "ModelBuilder": PassSpec(
        "genai_build",
        {
            "precision": ("precision", _lower),
            "int4_block_size": "block_size",
            "int4_accuracy_level": "accuracy_level",
            "int4_is_symmetric": "is_symmetric",
            "int4_op_types_to_quantize": "op_types_to_quantize",
        },
        {"metadata_only": False, "search": None, "extra_options": None, "int4_block_size": 32, "int4_is_symmetric": True},
    ),
    "IncQuantization": PassSpec(None, reason=NO_INC),
    "IncDynamicQuantization": PassSpec(None, reason=NO_INC),
    "IncStaticQuantization": PassSpec(None, reason=NO_INC),
}

# OrtSessionParamsTuning is no step in Kiln: it becomes the ONNX Runtime targets' searched settings.
_EXEC_MODE = {0: "sequential", 1: "parallel", "ORT_SEQUENTIAL": "sequential", "ORT_PARALLEL": "parallel"}
_OPT_LEVEL = {0: "disable", 1: "basic", 2: "extended", 99: "all"}
SESSION_OPTIONS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "intra_thread_num_list": ("intra_op_threads", lambda v: v),
    "inter_thread_num_list": ("inter_op_threads", lambda v: v),
    "execution_mode_list": ("execution_mode", lambda v: _EXEC_MODE.get(v, v)),
    "opt_level_list": ("graph_optimization_level", lambda v: _OPT_LEVEL.get(v, v)),
}
SESSION_DEFAULTS: dict[str, Any] = {
    "providers_list": None,
    "provider_options_list": {},
    "device": None,
    "cpu_cores": None,
    "force_evaluate_other_eps": False,
    "io_bind": False,
    "enable_cuda_graph": False,
    "extra_session_config": None,
    "enable_profiling": False,
    "trt_fp16_enable": False,
    "execution_mode_list": None,
    "opt_level_list": None,
    "intra_thread_num_list": None,
    "inter_thread_num_list": None,
}

# Values a "SEARCHABLE_VALUES" option takes in Olive, as Kiln spells them.
SEARCHABLE: dict[str, list[Any]] = {
    "mode": ["dynamic", "static"],
    "per_channel": [False, True],
    "reduce_range": [False, True],
    "weight_type": ["qint8", "quint8"],
    "activation_type": ["quint8", "qint8"],
    "quant_format": ["QDQ", "QOperator"],
    "calibration_method": ["MinMax", "Entropy", "Percentile"],
    "block_size": [32, 64, 128],
    "is_symmetric": [True, False],
    "preset": ["performance", "mixed"],
}
