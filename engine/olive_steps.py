"""One Olive pass (or a list of configs of one pass) → a Kiln step's config and search."""

from __future__ import annotations

from typing import Any

from engine.olive_passes import SEARCHABLE, PassSpec


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
        scope, scope_type = olive.get("ignored_scope"), olive.pop("ignored_scope_type", None) or "names"
        if scope and not isinstance(scope, dict):
            olive["ignored_scope"] = {scope_type: scope if isinstance(scope, list) else [scope]}
        for key, value in olive.items():
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
    needs_data = spec.kiln == "nncf_quantize" or config.get("mode") == "static"
    if spec.data and needs_data and spec.data not in config and spec.data not in search:
        config[spec.data] = ctx.dataset("calibration", f"{where}.data_config")
    return config, search


def _option(
    spec: PassSpec, key: str, value: Any, at: str, config: dict[str, Any], search: dict[str, Any], ctx: Any
) -> None:  # long: one branch per kind of Olive option
    if key in ("data_config", "calibration_data_config") and spec.data:
        config[spec.data] = ctx.dataset(value if isinstance(value, str) else (value or {}).get("name", "data"), at)
        return
    if key == "compress_config" and isinstance(value, dict) and spec.kiln == "nncf_compress_weights":
        config.update({k: (v.name if hasattr(v, "name") else v) for k, v in value.items()})
        return
    if key == "ignored_scope" and spec.kiln in ("nncf_quantize", "nncf_compress_weights") and value:
        config["ignored_scope"] = value
        return
    if key == "optimization_options" and spec.kiln == "ort_fusion" and isinstance(value, dict):
        _fusion_options(value, at, config, ctx)
        return
    if key == "float16" and value and spec.kiln == "ort_fusion":
        ctx.skip(at, "Kiln keeps FP16 a pass of its own: add an OnnxFloatToFloat16 pass (fp16) after this one")
        return
    if key.endswith("_func") or key in ("user_script", "script_dir"):
        if value:
            ctx.skip(at, "user code Kiln would have to run; it is never run silently")
        return
    mapped = spec.options.get(key)
    if mapped is None:
        if spec.defaults.get(key, object()) != value and not (key not in spec.defaults and value in (None, False)):
            ctx.skip(at, f"no option of Kiln's {spec.kiln} for it")
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
    if value != spec.defaults.get(key, object()) or kiln in spec.fixed:
        config[kiln] = convert(value)


_FUSION = {
    "enable_attention": "disable_attention",
    "enable_skip_layer_norm": "disable_skip_layer_norm",
    "enable_embed_layer_norm": "disable_embed_layer_norm",
    "enable_bias_skip_layer_norm": "disable_bias_skip_layer_norm",
    "enable_layer_norm": "disable_layer_norm",
    "enable_gelu": "disable_gelu",
    "enable_bias_gelu": "disable_bias_gelu",
}


def _fusion_options(options: dict[str, Any], at: str, config: dict[str, Any], ctx: Any) -> None:
    for key, value in options.items():
        if key in _FUSION:
            if not value:
                config[_FUSION[key]] = True
        elif key in ("enable_gelu_approximation", "use_multi_head_attention"):
            if value:
                config[key] = True
        else:
            ctx.skip(f"{at}.{key}", "no option of Kiln's ort_fusion for it")


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
