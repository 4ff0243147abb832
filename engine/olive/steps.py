"""One Olive pass (or a list of configs of one pass) → a Kiln step's config and search."""

from __future__ import annotations

from typing import Any

from engine.olive.openvino_passes import openvino_option
from engine.olive.options import EXTERNAL_DATA, NEVER_RUN, builder_precision, genai_algo
from engine.olive.passes import SEARCHABLE, VITIS_DTYPES, VITIS_METADATA, PassSpec
from engine.olive.quark_passes import quark_option


def _same(value: Any) -> Any:
    return value


def _search_values(value: Any) -> list[Any] | None:
    """The values of an Olive search parameter ({"type": "Categorical", "support": [...]}), else None."""
    if isinstance(value, dict) and str(value.get("type", "")).lower() == "categorical":
        return list(value.get("support") or value.get("values") or [])
    return None


def step_options(spec: PassSpec, configs: list[dict[str, Any]], where: str, ctx: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Kiln step's config and search from one Olive pass (a list of configs: a search over them)."""
    config: dict[str, Any] = dict(spec.fixed)
    search: dict[str, Any] = {}
    for index, olive in enumerate(configs):
        olive = {**olive, **(olive.get("config") or {})}
        if spec.kiln == "genai_build" and isinstance(olive.get("extra_options"), dict):
            olive = _builder_extra(olive, where, ctx)
        scope, scope_type = olive.get("ignored_scope"), olive.pop("ignored_scope_type", None) or "names"
        if scope and not isinstance(scope, dict):
            olive["ignored_scope"] = {scope_type: scope if isinstance(scope, list) else [scope]}
        for key, value in sorted(olive.items(), key=lambda item: item[0] == "optimization_options"):  # after model_type
            if key in ("type", "config", "disable_search"):
                continue
            at = f"{where}.{key}" if len(configs) == 1 else f"{where}[{index}].{key}"
            _option(spec, key, value, at, config, search, ctx)
    if len(configs) > 1:
        _merge_list(configs, spec, where, config, search, ctx)
    mode_searched = "mode" in search
    if mode_searched:  # the baseline runs Kiln's default mode (dynamic), which needs no data
        config.pop("mode", None)
    for key in list(config) if mode_searched else []:
        if key in spec.static_only:  # static-only options apply only where static is drawn
            search[key] = {"values": [config.pop(key)], "when": {"mode": "static"}}
    if config.get("mode") == "dynamic" or mode_searched:
        for key in spec.static_only if not mode_searched else ():
            config.pop(key, None)
    needs_data = (
        spec.kiln in ("nncf_quantize", "gptq", "quark_quantize")
        or config.get("mode") == "static"
        or (spec.kiln == "selective_mixed_precision" and config.get("algorithm") == "kld_gradient")
    )
    if spec.data and needs_data and spec.data not in config and spec.data not in search:
        if spec.kiln in ("gptq", "selective_mixed_precision"):  # Olive's default: wikitext-2 for a Hugging Face model
            config[spec.data] = ctx.default_text_calibration(f"{where}.data_config")
        else:
            config[spec.data] = ctx.dataset("calibration", f"{where}.data_config")
    return config, search


def _option(
    spec: PassSpec, key: str, value: Any, at: str, config: dict[str, Any], search: dict[str, Any], ctx: Any
) -> None:  # long: one branch per kind of Olive option
    if key in ("data_config", "calibration_data_config") and spec.data:
        config[spec.data] = ctx.dataset(value if isinstance(value, str) else (value or {}).get("name", "data"), at)
        return
    if key in EXTERNAL_DATA:
        if value not in (None, False) and spec.defaults.get(key, object()) != value:
            ctx.note_once("external data", f"{at}: Kiln writes weights over ~1.8 GB as external data itself (model.onnx.data)")
        return
    if _special(spec, key, value, at, config, ctx):
        return
    if key.endswith("_func") or key in ("user_script", "script_dir", "transform_fn"):
        if value:
            ctx.skip(at, NEVER_RUN)
        return
    mapped = spec.options.get(key)
    if mapped is None:
        if spec.defaults.get(key, object()) != value and not (key not in spec.defaults and value in (None, False)):
            ctx.skip(at, spec.dropped.get(key) or f"no option of Kiln's {spec.kiln} for it")
        return
    kiln, convert = (mapped, _same) if isinstance(mapped, str) else mapped
    choices = _search_values(value)
    if value == "SEARCHABLE_VALUES":
        choices = SEARCHABLE.get(kiln)
        if choices is None:
            ctx.skip(at, f"Kiln's {spec.kiln} does not search {kiln}")
            return
    elif choices is not None:
        choices = [convert(v) for v in choices]
    if choices is not None:
        if ctx.searching:
            search[kiln] = choices
        else:
            config[kiln] = choices[0]
            ctx.notes.append(f"{at}: no search_strategy, so Olive uses one value: {kiln} = {choices[0]!r}")
        return
    if key in spec.defaults and convert(value) == convert(spec.defaults[key]) and kiln not in spec.fixed:
        return
    if isinstance(value, list) and key == "keep_io_types":
        ctx.notes.append(f"{at}: Olive keeps only {', '.join(map(str, value))} in float32; Kiln's fp16 keeps every input and output")
    config[kiln] = convert(value)


def _special(spec: PassSpec, key: str, value: Any, at: str, config: dict[str, Any], ctx: Any) -> bool:  # long: one branch per option
    """Options whose value decides how they carry over (not one Kiln option each); True when handled here."""
    if openvino_option(spec.kiln, key, value, at, config, ctx):
        pass
    elif quark_option(spec.kiln, key, value, at, config, ctx):
        pass
    elif key == "compress_config" and isinstance(value, dict) and spec.kiln == "nncf_compress_weights":
        config.update({k: (v.name if hasattr(v, "name") else v) for k, v in value.items()})
    elif key == "ignored_scope" and spec.kiln in ("nncf_quantize", "nncf_compress_weights"):
        if value:
            config["ignored_scope"] = value
    elif key == "optimization_options" and spec.kiln == "ort_fusion" and isinstance(value, dict):
        _fusion_options(value, config.get("model_type"), at, config, ctx)
    elif spec.kiln == "ort_fusion" and key == "model_type" and not value:
        pass  # empty: Olive reads the model type from the model, as no model_type does
    elif spec.kiln == "ort_fusion" and key in FUSION_FP16:
        pass  # float16 and its options: the caller adds an fp16 step after the fusion
    elif spec.kiln == "genai_build" and key == "precision" and builder_precision(value):
        ctx.skip(at, str(builder_precision(value)))
    elif spec.kiln == "genai_build" and key == "int4_op_types_to_quantize" and isinstance(value, list):
        kept = [op for op in value if op in ("MatMul", "Gather")]
        if kept != value:
            left = ", ".join(str(op) for op in value if op not in kept)
            ctx.skip(at, f"Kiln's genai_build quantizes MatMul and Gather only: {left} stay in float")
        if kept and kept != ["MatMul"]:
            config["op_types_to_quantize"] = kept
    elif spec.kiln == "genai_build" and key == "int4_algo_config":
        if genai_algo(value) is None:
            ctx.skip(at, f"{value!r}: {spec.dropped[key]}")
        elif genai_algo(value) != "default":
            config["algo_config"] = genai_algo(value)
    elif spec.kiln == "inc_quantize" and key in ("metric", "tuning_criterion", "quant_level"):
        pass  # the caller decides between inc_quantize and inc_quantize_accuracy on these
    elif spec.kiln == "inc_quantize" and key == "approach" and value == "weight_only":
        pass  # the caller leaves the pass out
    elif spec.kiln == "inc_quantize" and key == "recipes" and isinstance(value, dict):
        _inc_recipes(value, at, config, ctx)
    elif spec.kiln == "add_metadata" and key in VITIS_METADATA:
        _vitis_metadata(key, value, at, config, ctx)
    elif spec.kiln == "inc_quantize" and key == "weight_only_config":
        pass  # read only with approach weight_only, which is not carried over
    else:
        return False
    return True


#: OrtTransformersOptimization's float16 conversion and its options, carried over as an fp16 step
FUSION_FP16 = ("float16", "keep_io_types", "force_fp32_ops", "force_fp32_nodes", "force_fp16_inputs")


def fusion_fp16(olive: dict[str, Any], where: str, ctx: Any) -> dict[str, Any] | None:
    """The fp16 step's config for OrtTransformersOptimization's float16 (None without it): Olive converts the
    fused model with onnxruntime's converter, keeping I/O in float32 by default and blocking force_fp32_ops."""
    if not olive.get("float16"):
        return None
    config: dict[str, Any] = {"keep_io_types": bool(olive.get("keep_io_types", True))}
    if olive.get("force_fp32_ops"):
        config["op_block_list"] = list(olive["force_fp32_ops"])
    if olive.get("force_fp32_nodes"):
        config["node_block_list"] = list(olive["force_fp32_nodes"])
    if olive.get("force_fp16_inputs"):
        ctx.skip(f"{where}.force_fp16_inputs", "Kiln's fp16 has no option to force an op's inputs to float16")
    ctx.notes.append(f"{where}: float16 → an fp16 step after the fusion (onnxruntime's converter, as Olive runs it)")
    return config


def _builder_extra(olive: dict[str, Any], where: str, ctx: Any) -> dict[str, Any]:
    """ModelBuilder's extra_options are more of the builder's own options, given last (Olive passes them
    over the named ones): read as options of the pass; the output file's name is Kiln's (model.onnx)."""
    extra = dict(olive.pop("extra_options"))
    if extra.pop("filename", None):
        ctx.notes.append(f"{where}.extra_options.filename: Kiln names the built model model.onnx in the genai folder")
    return {**olive, **extra}


def _inc_recipes(recipes: dict[str, Any], at: str, config: dict[str, Any], ctx: Any) -> None:
    for name, value in recipes.items():
        if name == "smooth_quant":
            config["smooth_quant"] = bool(value)
        elif name == "smooth_quant_args" and isinstance(value, dict):
            for arg, arg_value in value.items():
                if arg == "alpha":
                    config["smooth_quant_alpha"] = float(arg_value)
                else:
                    ctx.skip(f"{at}.smooth_quant_args.{arg}", "Kiln's INC passes take SmoothQuant's alpha only")
        elif name == "graph_optimization_level":
            config["graph_optimization_level"] = str(value).upper()
        else:
            ctx.skip(f"{at}.{name}", "no option of Kiln's INC passes for this recipe")


_FUSION = {
    "enable_attention": "disable_attention",
    "enable_skip_layer_norm": "disable_skip_layer_norm",
    "enable_embed_layer_norm": "disable_embed_layer_norm",
    "enable_bias_skip_layer_norm": "disable_bias_skip_layer_norm",
    "enable_layer_norm": "disable_layer_norm",
    "enable_gelu": "disable_gelu",
    "enable_bias_gelu": "disable_bias_gelu",
}


#: onnxruntime's FusionOptions defaults (onnxruntime.transformers.fusion_options), which Olive starts from
_FUSION_DEFAULTS = {
    "enable_gelu": True,
    "enable_layer_norm": True,
    "enable_attention": True,
    "enable_rotary_embeddings": True,
    "use_multi_head_attention": False,
    "disable_multi_head_attention_bias": False,
    "enable_skip_layer_norm": True,
    "enable_embed_layer_norm": True,
    "enable_bias_skip_layer_norm": True,
    "enable_bias_gelu": True,
    "enable_gelu_approximation": False,
    "enable_qordered_matmul": True,
    "enable_shape_inference": True,
    "enable_gemm_fast_gelu": False,
    "group_norm_channels_last": True,
}
#: the fusions onnxruntime turns on for diffusion models (unet, vae, clip)
_DIFFUSION = (
    "enable_nhwc_conv",
    "enable_group_norm",
    "enable_skip_group_norm",
    "enable_bias_splitgelu",
    "enable_packed_qkv",
    "enable_packed_kv",
    "enable_bias_add",
)


def _fusion_default(model_type: str | None, key: str) -> Any:
    if model_type in ("unet", "vae", "clip") and key in _DIFFUSION:
        return True
    if model_type == "clip" and key == "enable_embed_layer_norm":
        return False
    return _FUSION_DEFAULTS.get(key, False if key in _DIFFUSION else None)


def _fusion_options(options: dict[str, Any], model_type: str | None, at: str, config: dict[str, Any], ctx: Any) -> None:
    """Olive's optimization_options (onnxruntime's FusionOptions for the model type, updated): what differs from
    the model type's defaults becomes Kiln's ort_fusion options."""
    for key, value in options.items():
        if value == _fusion_default(model_type, key):
            continue
        if key in _FUSION and not value:
            config[_FUSION[key]] = True
        elif key in ("enable_gelu_approximation", "use_multi_head_attention") and value:
            config[key] = True
        elif key == "enable_shape_inference" and not value:
            config["disable_shape_inference"] = True
        else:
            ctx.skip(
                f"{at}.{key}",
                f"{key}: {value!r}: no option of Kiln's ort_fusion for it (onnxruntime's default for {model_type or 'bert'} is kept)",
            )


def _merge_list(
    configs: list[dict[str, Any]], spec: PassSpec, where: str, config: dict[str, Any], search: dict[str, Any], ctx: Any
) -> None:
    """Olive's list of configs for one pass: the options that differ become searched values."""
    types = {str(c.get("type")) for c in configs}
    if len(types) > 1:
        ctx.skip(where, f"a list of different pass types ({', '.join(sorted(types))}): only the first is carried over")
        return
    per: list[dict[str, Any]] = []
    for olive in configs:
        one: dict[str, Any] = dict(spec.fixed)
        for key, value in {**olive, **(olive.get("config") or {})}.items():
            if key not in ("type", "config") and key in spec.options:
                mapped = spec.options[key]
                kiln, convert = (mapped, _same) if isinstance(mapped, str) else mapped
                one[kiln] = convert(value)
        per.append(one)
    for kiln in {k for one in per for k in one}:
        values = [one.get(kiln) for one in per]
        distinct = [v for i, v in enumerate(values) if v not in values[:i]]
        if len(distinct) > 1:
            search[kiln] = distinct
            config.pop(kiln, None)
        else:
            config[kiln] = distinct[0]
    ctx.notes.append(f"{where}: a list of configs → a search over the options that differ (Kiln crosses them)")


def _vitis_metadata(key: str, value: Any, at: str, config: dict[str, Any], ctx: Any) -> None:
    """VitisAIAddMetaData's activation_type / weight_type (as Vitis AI spells them) and quant_type, into metadata."""
    if key == "quant_type":
        written: Any = value
    else:
        written = VITIS_DTYPES.get(str(value).lower()) if value is not None else None
        if value is not None and written is None:
            ctx.skip(at, f"{value!r}: Olive's VitisAIAddMetaData takes {', '.join(VITIS_DTYPES)} (it refuses others too)")
            return
    if written is not None:
        config["metadata"] = {**config.get("metadata", {}), VITIS_METADATA[key]: str(written)}
