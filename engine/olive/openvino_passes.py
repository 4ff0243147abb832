"""Olive's OpenVINO execution-provider chain → Kiln's passes: OpenVINOOptimumConversion
(``openvino_optimum_convert``), OpenVINOIoUpdate (``openvino_io_update``) and
OpenVINOEncapsulation (``openvino_encapsulate``), with the options whose values are dicts of other
options (``extra_args``, ``ov_quant_config``) read key by key."""

from __future__ import annotations

from typing import Any

from engine.olive.spec import PassSpec

REUSE_CACHE = (
    "Olive writes over the input's folder to save space; Kiln's store keeps each step's output (identical files shared by content)"
)
GENAI_FILES = "Kiln's openvino_encapsulate writes the context model and the IR only, no genai_config.json"

OPENVINO_EP_PASSES: dict[str, PassSpec] = {
    "OpenVINOOptimumConversion": PassSpec(
        "openvino_optimum_convert",
        {},
        {"extra_args": None, "ov_quant_config": None, "components": None, "device": "cpu"},
        dropped={
            "components": "Kiln's openvino_optimum_convert exports one model (the task's main one)",
            "device": "Kiln exports on the CPU; the model runs on the target's device",
        },
    ),
    "OpenVINOIoUpdate": PassSpec(
        "openvino_io_update",
        {"static": "static", "input_shapes": "input_shapes", "input_names": "input_names"},
        {"static": False, "input_shapes": None, "input_names": None, "reuse_cache": False, "extra_configs": None},
        dropped={"reuse_cache": REUSE_CACHE, "extra_configs": "Olive's OpenVINOIoUpdate reads no extra_configs either"},
    ),
    "OpenVINOEncapsulation": PassSpec(
        "openvino_encapsulate",
        {
            "target_device": ("target_device", lambda v: str(v).lower()),
            "ov_version": "ov_version",
            "keep_ov_dynamic_dims": "keep_ov_dynamic_dims",
            "opset_imports": ("opset_imports", lambda v: [list(pair) for pair in v]),
        },
        {"target_device": "cpu", "ov_version": None, "keep_ov_dynamic_dims": False, "reuse_cache": False, "genai_config_override": None},
        dropped={"reuse_cache": REUSE_CACHE, "genai_config_override": GENAI_FILES},
    ),
}

#: ov_quant_config keys that are Kiln's weight_compression options (Olive's spellings → Kiln's)
_COMPRESSION_KEYS = {
    "weight_format": "weight_format",
    "group_size": "group_size",
    "ratio": "ratio",
    "sym": "sym",
    "all_layers": "all_layers",
    "all-layers": "all_layers",
    "awq": "awq",
    "scale_estimation": "scale_estimation",
    "gptq": "gptq",
    "lora_correction": "lora_correction",
    "sensitivity_metric": "sensitivity_metric",
    "backup_precision": "backup_precision",
    "group_size_fallback": "group_size_fallback",
    "dataset": "dataset",
    "num_samples": "num_samples",
}
_QUANT_REFUSED = {
    "trust_remote_code": "Kiln runs a model's own code only with input.trust_remote_code: true (set it on the input)",
    "quant_mode": "Kiln's openvino_optimum_convert compresses weights only; full quantization is nncf_quantize",
    "smooth_quant_alpha": "Kiln's openvino_optimum_convert compresses weights only; full quantization is nncf_quantize",
    "quantization_statistics_path": "Kiln's openvino_optimum_convert computes statistics in each run",
    "cache_dir": "Kiln's jobs read the input model's folder",
}
_EXTRA_ARGS = {"task": "task", "library": "library"}
_EXTRA_REFUSED = {
    "device": "Kiln exports on the CPU; the model runs on the target's device",
    "framework": "Kiln's openvino_optimum_convert exports PyTorch models",
    "disable_convert_tokenizer": "Kiln's openvino_optimum_convert never converts the tokenizer (its output is one IR)",
    "trust_remote_code": "Kiln runs a model's own code only with input.trust_remote_code: true (set it on the input)",
}


def openvino_option(kiln: str | None, key: str, value: Any, at: str, config: dict[str, Any], ctx: Any) -> bool:
    """``extra_args`` and ``ov_quant_config`` of OpenVINOOptimumConversion, key by key; True when handled."""
    if kiln != "openvino_optimum_convert" or key not in ("extra_args", "ov_quant_config") or not isinstance(value, dict):
        return False
    if key == "extra_args":
        for name, item in value.items():
            if name in _EXTRA_ARGS:
                config[_EXTRA_ARGS[name]] = item
            elif name == "disable_stateful":
                config["stateful"] = not item
            elif item not in (None, False):
                ctx.skip(f"{at}.{name}", _EXTRA_REFUSED.get(name, "no option of Kiln's openvino_optimum_convert for it"))
        return True
    compression: dict[str, Any] = {}
    for name, item in value.items():
        if name in _COMPRESSION_KEYS:
            compression[_COMPRESSION_KEYS[name]] = item
        elif name == "task" and "task" not in config:
            config["task"] = item
        elif item not in (None, False):
            ctx.skip(f"{at}.{name}", _QUANT_REFUSED.get(name, "no weight-compression option of Kiln's openvino_optimum_convert for it"))
    if compression.get("weight_format") in ("fp16", "fp32"):
        config["weight_compression"] = {"weight_format": compression["weight_format"]}
    elif compression.get("weight_format"):
        config["weight_compression"] = {k: v for k, v in compression.items() if v is not None and (v is not False or k == "sym")}
    elif compression:
        ctx.skip(at, "compression options without a weight_format (Olive refuses these too)")
    return True
