"""Olive passes → Kiln steps: one table entry per Olive pass type.

An entry names the Kiln pass, how each Olive option carries over (a Kiln option name, or a name
and a function of the value), and Olive's defaults (an option left at its default is dropped
silently). An option neither mapped nor at its default is reported as not carried over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.olive.decoder_passes import DECODER_PASSES
from engine.olive.openvino_passes import OPENVINO_EP_PASSES
from engine.olive.options import (
    BLOCKWISE,
    BUILDER_DROPPED,
    EP_CONTEXT_DROPPED,
    INC_DEFAULTS,
    INC_DROPPED,
    INC_OPTIONS,
    INT4,
    INT4_DROPPED,
    QUANT_DEFAULTS,
    QUANT_DROPPED,
    QUANT_OPTIONS,
    STATIC,
    keep_io_types,
    lower,
    upper,
)
from engine.olive.quark_passes import QUARK_PASSES
from engine.olive.spec import PassSpec

PASSES: dict[str, PassSpec] = {
    "OnnxConversion": PassSpec(
        "torch_export",
        {
            "target_opset": "opset",
            "use_dynamo_exporter": ("exporter", lambda v: "dynamo" if v else "torchscript"),
            "dynamic": "dynamic_axes",
        },
        {
            "target_opset": 20,
            "use_dynamo_exporter": False,
            "past_key_value_name": "past_key_values",
            "device": "cpu",
            "torch_dtype": None,
            "parallel_jobs": None,
            "merge_adapter_weights": False,
            "save_metadata_for_token_generation": False,
            "optimize": True,
            "dynamic": True,
        },
        {"opset": 20},  # Olive 0.13's default opset; Kiln's is 17
        dropped={
            "torch_dtype": "Kiln exports the model in float32: add an fp16 step after the export",
            "device": "Kiln exports on the CPU",
            "save_metadata_for_token_generation": "Kiln's torch_export writes the model only (decoder_export writes a genai folder)",
            "optimize": "Kiln's torch_export always folds constants",
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
        },
    ),
    "OnnxQuantization": PassSpec(
        "ort_quantize",
        QUANT_OPTIONS,
        {**QUANT_DEFAULTS, "quant_mode": "static"},
        {"mode": "static", "activation_type": "qint8"},
        "calibration",
        STATIC,
        dropped=QUANT_DROPPED,
    ),
    "OnnxDynamicQuantization": PassSpec(
        "ort_quantize",
        QUANT_OPTIONS,
        {**QUANT_DEFAULTS, "quant_mode": "dynamic", "quant_format": "QOperator"},
        {"mode": "dynamic"},
        dropped=QUANT_DROPPED,
    ),
    "OnnxStaticQuantization": PassSpec(
        "ort_quantize",
        QUANT_OPTIONS,
        {**QUANT_DEFAULTS, "quant_mode": "static"},
        {"mode": "static", "activation_type": "qint8"},  # Olive 0.13's int8 activations; Kiln's default is quint8
        "calibration",
        STATIC,
        dropped=QUANT_DROPPED,
    ),
    "OnnxMatMul4Quantizer": PassSpec(
        "int4_weights",
        INT4,
        {"block_size": 32, "is_symmetric": True, "accuracy_level": None, "nodes_to_exclude": None, "algorithm": None, "bits": 4},
        dropped=INT4_DROPPED,
    ),
    "OnnxBlockWiseRtnQuantization": PassSpec(
        "int4_weights", INT4, BLOCKWISE, {"block_size": 128, "op_types": ["MatMul", "Gather"]}, dropped=INT4_DROPPED
    ),
    "OnnxHqqQuantization": PassSpec(
        "int4_weights",
        {"block_size": "block_size", "nodes_to_exclude": "nodes_to_exclude"},
        BLOCKWISE,
        {"algorithm": "hqq", "block_size": 128},
        dropped={**INT4_DROPPED, "accuracy_level": "Kiln's hqq leaves the MatMulNBits compute type unset"},
    ),
    "ComposeOnnxModels": PassSpec("compose_models"),
    # each surgeon with Olive's name and options: graph_surgery takes them as they are
    "GraphSurgeries": PassSpec("graph_surgery", {"surgeries": "surgeries"}),
    "OnnxFloatToFloat16": PassSpec(
        "fp16",
        {
            "keep_io_types": ("keep_io_types", keep_io_types),
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
        dropped={
            "op_include_list": "Kiln's fp16 converts every op but those blocked (op_block_list): list the others there",
            "node_include_list": "Kiln's fp16 converts every node but those blocked (node_block_list): list the others there",
        },
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
        dropped={
            "onnxscript_optimize": "Kiln's onnx_simplify always runs onnxslim's rewrites",
            "onnxoptimizer_optimize": "Kiln's onnx_simplify always runs onnxslim's rewrites",
            "fuse_reshape_operations": "Kiln's onnx_simplify always runs onnxslim's rewrites",
            "fix_com_microsoft_opset": "no option of Kiln's onnx_simplify for it",
            "cast_chain_elimination": "onnxslim removes redundant Cast chains itself",
        },
    ),
    "OpenVINOConversion": PassSpec(
        "openvino_convert",
        {"compress_to_fp16": "compress_to_fp16"},
        {
            "model_name": "ov_model",
            "static": False,
            "extra_configs": None,
            "input_shapes": None,
            "example_input_func": None,
            "output_model": None,
        },
        {"compress_to_fp16": True},  # Olive's default; Kiln's is false
        dropped={
            "model_name": "Kiln names the IR model.xml",
            "output_model": "Kiln names the IR model.xml",
            "input_shapes": "Kiln's openvino_convert takes shapes by input name (input_shapes: {name: dims}): Olive's are by position",
            "static": "Kiln's openvino_convert fixes the shapes given in input_shapes: give them by input name",
        },
    ),
    "OpenVINOQuantization": PassSpec(
        "nncf_quantize",
        {"model_type": ("model_type", lower), "preset": ("preset", lower), "target_device": ("target_device", upper)},
        {"model_type": None, "reuse_cache": False, "extra_configs": None, "transform_fn": None, "ignored_scope_type": None},
        {"preset": "performance"},  # Olive's default; Kiln's is mixed
        "calibration",
    ),
    "OpenVINOWeightCompression": PassSpec(
        "nncf_compress_weights",
        {"target_device": ("target_device", upper)},
        {"reuse_cache": False, "extra_args": None, "transform_fn": None, "ignored_scope_type": None, "target_device": None},
        {},
        "dataset",
    ),
    "ModelBuilder": PassSpec(
        "genai_build",
        {
            "precision": ("precision", lower),
            "int4_block_size": "block_size",
            "int4_accuracy_level": ("accuracy_level", lambda v: v or None),  # 0: unset
            "int4_is_symmetric": "is_symmetric",
            "int4_op_types_to_quantize": "op_types_to_quantize",
            "int4_algo_config": ("algo_config", lower),
        },
        {
            "precision": "fp32",
            "metadata_only": False,
            "search": None,
            "extra_options": None,
            "int4_block_size": 32,
            "int4_is_symmetric": True,
            "int4_accuracy_level": None,
        },
        dropped=BUILDER_DROPPED,
    ),
    "IncQuantization": PassSpec(
        "inc_quantize", INC_OPTIONS, {**INC_DEFAULTS, "approach": "static"}, {"mode": "static"}, "calibration", dropped=INC_DROPPED
    ),
    "IncStaticQuantization": PassSpec(
        "inc_quantize", INC_OPTIONS, {**INC_DEFAULTS, "approach": "static"}, {"mode": "static"}, "calibration", dropped=INC_DROPPED
    ),
    "IncDynamicQuantization": PassSpec(
        "inc_quantize", INC_OPTIONS, {**INC_DEFAULTS, "approach": "dynamic"}, {"mode": "dynamic"}, dropped=INC_DROPPED
    ),
    "EPContextBinaryGenerator": PassSpec(
        "ort_compile",
        {"embed_context": "embed"},
        {"embed_context": False, "weight_sharing": False, "provider_options": None, "session_options": None, "disable_cpu_fallback": False},
        dropped=EP_CONTEXT_DROPPED,
    ),
}
#: Vitis AI's quantization types by Olive's Precision name (olive.passes.onnx.vitis_ai.meta_data)
VITIS_DTYPES = {"int4": "Int4", "uint4": "UInt4", "int8": "QInt8", "uint8": "QUInt8", "int16": "QInt16", "uint16": "QUInt16"}
#: VitisAIAddMetaData's options → the metadata key each writes
VITIS_METADATA = {"activation_type": "activation_dtype", "weight_type": "weight_dtype", "quant_type": "quant_type"}
PASSES["VitisAIAddMetaData"] = PassSpec(
    "add_metadata",
    {},
    {"config_meta_data_keys": [], "activation_type": None, "weight_type": None, "quant_type": "NA"},
    {"lineage": False, "metadata": {"quant_type": "NA"}},  # Olive writes quant_type NA when none is given
    dropped={
        "config_meta_data_keys": (
            "the Hugging Face config's values (architectures, model_type) are not read by Kiln's add_metadata: "
            "add them to the step's metadata by hand"
        ),
    },
)
PASSES["QNNPreprocess"] = PassSpec(
    "qnn_preprocess",
    {
        "fuse_layernorm": "fuse_layernorm",
        "inputs_to_make_channel_last": "inputs_to_make_channel_last",
        "outputs_to_make_channel_last": "outputs_to_make_channel_last",
    },
    {"fuse_layernorm": False, "inputs_to_make_channel_last": None, "outputs_to_make_channel_last": None},
)
#: OnnxPeepholeOptimizer with onnxoptimizer off: Kiln's onnx_peephole runs Olive's other switches as Olive does
PEEPHOLE = PassSpec(
    "onnx_peephole",
    {
        "onnxscript_optimize": "onnxscript_optimize",
        "fuse_reshape_operations": "fuse_reshape_operations",
        "fix_com_microsoft_opset": "fix_com_microsoft_opset",
        "cast_chain_elimination": "cast_chain_elimination",
    },
    {
        "onnxscript_optimize": True,
        "onnxoptimizer_optimize": False,  # the translation takes this spec only when it is off
        "fuse_reshape_operations": True,
        "fix_com_microsoft_opset": False,
        "cast_chain_elimination": False,
    },
)
#: Olive matches pass types case-insensitively (olive.package_config): so does the translation
PASSES.update(DECODER_PASSES)
PASSES.update(OPENVINO_EP_PASSES)
PASSES.update(QUARK_PASSES)
PASSES_BY_TYPE: dict[str, PassSpec] = {name.lower(): spec for name, spec in PASSES.items()}
#: the Olive name of each pass type, by its lower-cased spelling
PASS_NAMES: dict[str, str] = {name.lower(): name for name in PASSES}


def pass_spec(kind: str) -> PassSpec | None:
    return PASSES_BY_TYPE.get(kind.lower())


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
