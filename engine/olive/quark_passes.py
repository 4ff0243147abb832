"""Olive's AMD Quark passes → Kiln's ``quark_quantize``, where they run Quark's ONNX path.

Olive's ``QuarkQuantization`` and ``QuarkQuantizationVitisAI`` route by the model they are
handed: an ONNX model goes to Quark's ONNX quantizer (``quark.onnx``'s ModelQuantizer with a
QConfig built from ``global_config``, ``exclude``, ``algo_config`` and ``extra_options``), a
Hugging Face / PyTorch model to Quark's torch path (LLM weight quantization, ``quark.torch``).
Only the ONNX path has a Kiln counterpart; a Quark pass handed any other model is listed.

The two passes run the same quantizer; they differ in the global configuration's defaults.
``QuarkQuantization`` fills an activation or weight entry's missing fields with Int8, symmetric,
Percentile, per tensor, Float32 scales (Kiln's defaults); ``QuarkQuantizationVitisAI`` starts
activations from Quark's UInt8Spec (UInt8, asymmetric), written out as ``fixed``. Neither reads
``quant_mode`` or ``quant_format`` on the ONNX path (Quark quantizes statically, to QDQ).
"""

from __future__ import annotations

from typing import Any

from engine.olive.missing import PASS_REASONS
from engine.olive.spec import PassSpec

#: Quark's tensor fields Kiln's quark_quantize takes, with the values it takes
_TENSOR_VALUES: dict[str, tuple[Any, ...]] = {
    "data_type": ("Int8", "UInt8", "Int16", "UInt16", "Int32", "UInt32", "Float16", "BFloat16", "BFP16"),
    "symmetric": (True, False),
    "calibration_method": ("MinMax", "Entropy", "Percentile", "Distribution", "MinMSE", "LayerwisePercentile"),
    "quant_granularity": ("Tensor", "Channel", "Group"),
    "scale_type": ("Float32", "PowerOf2", "Int16"),
}
#: Olive's defaults of the options only Quark's torch path reads
_TORCH_OPTIONS: dict[str, Any] = {
    "quant_scheme": "uint4_wo_128",
    "quant_algo": "awq",
    "dataset": "pileval_for_awq_benchmark",
    "data_type": "bfloat16",
    "num_calib_data": 128,
    "model_export": "hf_format",
    "exclude_layers": None,
    "layer_quant_scheme": None,
    "kv_cache_dtype": None,
    "min_kv_scale": 0.0,
    "kv_cache_post_rope": False,
    "attention_dtype": None,
    "seq_len": 512,
    "batch_size": 1,
    "pack_method": "reorder",
    "export_weight_format": "real_quantized",
    "custom_mode": "quark",
    "trust_remote_code": True,
    "algo_configs": None,
    "quant_config": None,
}
_TORCH_ONLY = "an option of Quark's torch path (a Hugging Face model); Olive's Quark pass does not read it for an ONNX model"
_LAYERS = "Kiln's quark_quantize sets one configuration for the whole model (activation, weight): exclude nodes with exclude"
_ONNX_DEFAULTS: dict[str, Any] = {
    "quant_mode": "static",
    "quant_format": "QDQ",
    "global_config": None,
    "specific_layer_config": None,
    "layer_type_config": None,
    "exclude": None,
    "algo_config": None,
    "extra_options": None,
}
_DROPPED = {
    **dict.fromkeys(_TORCH_OPTIONS, _TORCH_ONLY),
    "quant_mode": "Olive's Quark ONNX path does not read it: Quark quantizes statically (calibrated)",
    "quant_format": "Olive's Quark ONNX path does not read it: Quark writes QDQ models",
    "specific_layer_config": _LAYERS,
    "layer_type_config": _LAYERS,
}


def _spec(fixed: dict[str, Any]) -> PassSpec:
    defaults = {**_TORCH_OPTIONS, **_ONNX_DEFAULTS}
    return PassSpec("quark_quantize", {"exclude": "exclude"}, defaults, fixed, "calibration", dropped=_DROPPED)


QUARK_PASSES: dict[str, PassSpec] = {
    "QuarkQuantization": _spec({}),
    # Olive's Vitis AI variant starts activations from Quark's UInt8Spec (UInt8, asymmetric)
    "QuarkQuantizationVitisAI": _spec({"activation": {"data_type": "UInt8", "symmetric": False}}),
}


def _algorithms() -> dict[str, tuple[str, ...]]:
    """The algorithms Kiln's quark_quantize takes, with the options of each (the pass declares them)."""
    from engine import registry

    return dict(registry.load("passes", "quark_quantize").algorithm_options)


def torch_path(spec: PassSpec | None, kind: str, handed_on: str) -> str | None:
    """Why a Quark pass handed a model other than ONNX is listed (Olive runs Quark's torch path on it)."""
    if spec is None or spec.kiln != "quark_quantize" or handed_on == "onnx":
        return None
    return PASS_REASONS.get(kind.lower(), "runs Quark's torch path, which Kiln does not wrap")


def quark_option(kiln: str | None, key: str, value: Any, at: str, config: dict[str, Any], ctx: Any) -> bool:
    """``global_config``, ``algo_config`` and ``extra_options`` of Olive's Quark passes; True when handled."""
    if kiln != "quark_quantize" or key not in ("global_config", "algo_config", "extra_options"):
        return False
    if key == "extra_options":
        if isinstance(value, dict) and value:
            config["extra_options"] = dict(value)
    elif key == "global_config" and isinstance(value, dict):
        for name, entry in value.items():
            if name in ("activation", "weight") and isinstance(entry, dict):
                config[name] = _tensor(entry, dict(config.get(name) or {}), f"{at}.{name}", ctx)
            else:
                ctx.skip(f"{at}.{name}", "Kiln's quark_quantize configures activation and weight (input tensors follow activation)")
    elif key == "algo_config" and isinstance(value, list):
        algorithms = [a for a in (_algorithm(entry, f"{at}[{i}]", ctx) for i, entry in enumerate(value)) if a]
        if algorithms:
            config["algorithms"] = algorithms
    elif value is not None:
        ctx.skip(at, f"{value!r} is not the shape Olive's Quark pass takes for {key}")
    return True


def _tensor(entry: dict[str, Any], base: dict[str, Any], at: str, ctx: Any) -> dict[str, Any]:
    """One tensor configuration over ``base``: Olive replaces a value Quark lacks with its default (and warns); Kiln lists it."""
    tensor = dict(base)
    for field, item in entry.items():
        item = "Int8" if field == "data_type" and item == "XInt8" else item  # Olive's Vitis AI variant: XInt8Spec's data type
        if field in _TENSOR_VALUES and item in _TENSOR_VALUES[field]:
            tensor[field] = item
        elif field in _TENSOR_VALUES:
            ctx.skip(f"{at}.{field}", f"{item!r} is not one of {', '.join(map(str, _TENSOR_VALUES[field]))}: Quark's default applies")
        else:
            ctx.skip(f"{at}.{field}", f"no field of Quark's tensor configuration Kiln's quark_quantize sets ({', '.join(_TENSOR_VALUES)})")
    return tensor


def _algorithm(entry: Any, at: str, ctx: Any) -> dict[str, Any] | None:
    """One of Olive's algo_config entries as Kiln's; Olive ignores unknown names and options, Kiln lists them."""
    options = _algorithms()
    name = entry.get("name") if isinstance(entry, dict) else None
    if name not in options:
        ctx.skip(at, f"{name!r} is not an algorithm of Quark's ONNX quantizer ({', '.join(options)}): Olive ignores it too")
        return None
    algorithm = {"name": name}
    for key, value in entry.items():
        if key in options[name]:
            algorithm[key] = value
        elif key != "name":
            ctx.skip(f"{at}.{key}", f"not an option Olive's Quark pass sets on {name}: Olive ignores it too")
    return algorithm
