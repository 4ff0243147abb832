"""Olive's chain of passes → Kiln's steps.

Each pass Kiln has becomes a step ``after`` the one before (Olive runs its passes in order). Pass
types match as Olive matches them: case-insensitively. A step whose Kiln pass cannot take the
model the step before hands on (Olive's chain would feed an OpenVINO model to an ONNX pass, a pass
Kiln dropped left a gap) takes the output of the nearest earlier step it can take, or the input
model: a branch, named in the notes; a pass that can take none of them is listed. An option value
Kiln's pass refuses is listed with the pass's own message instead of making the workflow invalid.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from engine import registry
from engine.core.refs import RefKind, references
from engine.olive.decoder_passes import QNN_STATIC, capture_split_info, split_spec
from engine.olive.metrics import translate_metric
from engine.olive.missing import missing_pass_reason
from engine.olive.options import METADATA_ONLY, NO_INC_WEIGHT_ONLY
from engine.olive.passes import PEEPHOLE, pass_spec
from engine.olive.quark_passes import torch_path
from engine.olive.spec import PassSpec
from engine.olive.steps import fusion_fp16, step_options
from engine.olive.systems import session_settings

#: Olive's INC accuracy goal types → Kiln's loss type and how the goal's value becomes a tolerable loss
_INC_GOALS = {"max-degradation": ("absolute", 1.0), "percent-max-degradation": ("relative", 0.01)}


def pass_type(value: Any) -> str:
    first = value[0] if isinstance(value, list) and value else value
    return str(first.get("type", "")) if isinstance(first, dict) else ""


def translate_steps(passes: dict[str, Any], input_format: str, ctx: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The steps and the ONNX Runtime targets' session settings (from OrtSessionParamsTuning)."""
    steps: list[dict[str, Any]] = []
    formats: dict[str, str] = {}  # step id → the format it hands on
    session: dict[str, Any] = {}
    for name, value in passes.items():
        where = ctx.at = f"passes.{name}"
        configs = value if isinstance(value, list) else [value]
        kind = pass_type(value)
        if kind.lower() == "ortsessionparamstuning":
            tuning = {k: v for k, v in configs[0].items() if k != "data_config"}
            if configs[0].get("data_config"):
                ctx.notes.append(f"{where}.data_config: Kiln times the session settings on the latency evaluation's data")
            session = session_settings(tuning, where, ctx)
            continue
        if kind.lower() == "capturesplitinfo":  # Kiln's split_model splits where Olive's SplitModel does
            ctx.split_info = capture_split_info(configs[0], where, ctx)
            continue
        whole = {**configs[0], **(configs[0].get("config") or {})}
        spec = _peephole(_spec(kind, ctx), whole)
        refused = _refused(kind, spec, whole) or torch_path(spec, kind, formats[steps[-1]["id"]] if steps else input_format)
        if spec is None or spec.kiln is None or refused:
            ctx.skip(where, refused or (spec.reason if spec else missing_pass_reason(kind)))
            continue
        config, search = step_options(spec, configs, where, ctx)
        kiln = spec.kiln
        if kiln == "inc_quantize" and _inc_accuracy(whole, config, where, ctx):
            kiln = "inc_quantize_accuracy"
        elif kiln == "inc_quantize" and whole.get("quant_level") not in (None, "auto"):
            ctx.skip(f"{where}.quant_level", "Kiln's inc_quantize quantizes once; quant_level is a tuning option (inc_quantize_accuracy)")
        if kiln == "ort_fusion" and "model_type" not in config:
            ctx.notes.append(f"{where}: Olive reads model_type from the model; Kiln's ort_fusion defaults to bert")
        if kiln == "torch_export":
            config = {**ctx.export, **config}
        cls = registry.load("passes", kiln)
        after = _after(cls, steps, formats, input_format, where, ctx)
        if after is None:
            continue
        step: dict[str, Any] = {"id": _unique(ctx.plain(name), steps), "pass": kiln}
        if after:
            step["after"] = after
        _drop_refused(cls, config, where, ctx)
        if kiln == "fixed_shape" and not {"dim_param", "input_name"} & set(config):
            ctx.skip(where, "names no dims to fix (dim_param with dim_value, or input_name with input_shape, as lists)")
            continue
        if config:
            step["config"] = config
        if search:
            step["search"] = search
        steps.append(step)
        formats[step["id"]] = cls.output_format(formats[after] if after else input_format)
        fp16 = fusion_fp16(whole, where, ctx) if kiln == "ort_fusion" else None
        if fp16 is not None:
            steps.append({"id": _unique(f"{step['id']}_fp16", steps), "pass": "fp16", "after": step["id"], "config": fp16})
            formats[steps[-1]["id"]] = "onnx"
    return steps, session


def _spec(kind: str, ctx: Any) -> PassSpec | None:
    """The translation of an Olive pass type here: QNN's static quantization on a QNN system, the
    split a CaptureSplitInfo before it recorded."""
    if kind.lower() == "onnxstaticquantization" and getattr(ctx, "qnn", False):
        return QNN_STATIC
    if kind.lower() == "splitmodel":
        return split_spec(getattr(ctx, "split_info", None))
    return pass_spec(kind)


def _peephole(spec: PassSpec | None, whole: dict[str, Any]) -> PassSpec | None:
    """Olive's peephole optimizer with onnxoptimizer off is Kiln's onnx_peephole (Olive's other
    switches, run as Olive runs them); with it on, onnx_simplify (onnxslim) is the nearest."""
    if spec is not None and spec.kiln == "onnx_simplify" and whole.get("onnxoptimizer_optimize") is False:
        return PEEPHOLE
    return spec


def _refused(kind: str, spec: PassSpec | None, whole: dict[str, Any]) -> str | None:
    """Why a pass Kiln has is still not carried over with these options (None: it is)."""
    kiln = spec.kiln if spec else None
    if whole.get("metadata_only") and kiln == "genai_build":
        return METADATA_ONLY
    if whole.get("approach") == "weight_only" and kiln == "inc_quantize":
        return NO_INC_WEIGHT_ONLY
    return None


def _unique(wanted: str, steps: list[dict[str, Any]]) -> str:
    taken = {s["id"] for s in steps}
    name, index = wanted, 2
    while name in taken:
        name, index = f"{wanted}_{index}", index + 1
    return name


def _after(cls: Any, steps: list[dict[str, Any]], formats: dict[str, str], input_format: str, where: str, ctx: Any) -> str | None:
    """The step whose output this one takes ('' for the input model), or None when it can take none."""
    chain = [(s["id"], formats[s["id"]]) for s in reversed(steps)] + [("", input_format)]
    for index, (step_id, fmt) in enumerate(chain):
        if fmt in cls.accepts:
            if index:
                took = f"step '{step_id}''s {fmt} model" if step_id else f"the {fmt} input model"
                ctx.notes.append(
                    f"{where}: Kiln's {cls.name} cannot take the {chain[0][1]} model of the step before it, so it takes {took}: "
                    "a branch of the chain (Olive would hand it the model before)"
                )
            return step_id
    ctx.skip(
        where,
        f"Kiln's {cls.name} takes {', '.join(cls.accepts)} models; the chain here has only {', '.join(sorted({f for _, f in chain}))}",
    )
    return None


def _drop_refused(cls: Any, config: dict[str, Any], where: str, ctx: Any) -> None:
    """Options whose value the Kiln pass refuses are listed (with its message) and left out."""
    for _ in range(3):
        try:
            cls.Config.model_validate(config)
            return
        except ValidationError as error:
            refused = {str(e["loc"][0]): e["msg"] for e in error.errors() if e["loc"] and str(e["loc"][0]) in config}
        if not refused:
            return
        for option, message in refused.items():
            ctx.skip(
                f"{where}.{option}",
                f"{config.pop(option)!r} is not a value Kiln's {cls.name} takes for {option} ({message}): left out, so its default applies",
            )


def task_refused(steps: list[dict[str, Any]], task: str) -> str | None:
    """Why the input's task cannot go to a step that takes it from the input (None when every one takes it)."""
    for step in steps:
        cls = registry.load("passes", step["pass"])
        for option in references(cls.Config).get(RefKind.TASK, ()):
            if option in (step.get("config") or {}):
                continue
            try:
                cls.Config.model_validate({**(step.get("config") or {}), option: task})
            except ValidationError as error:
                if any(e["loc"] and e["loc"][0] == option for e in error.errors()):
                    return f"{task!r}: Kiln's {cls.name} (step '{step['id']}') does not take it as its {option}"
    return None


def _inc_accuracy(olive: dict[str, Any], config: dict[str, Any], where: str, ctx: Any) -> bool:
    """Olive's INC tunes for accuracy when ``metric`` is given and its first sub-type has a goal: then the
    step is Kiln's inc_quantize_accuracy, judged by that metric as a workflow evaluation."""
    metric = olive.get("metric")
    subs = (metric or {}).get("sub_types") or [] if isinstance(metric, dict) else []
    if not isinstance(metric, dict) or not subs or not subs[0].get("goal"):
        if metric:
            ctx.notes.append(f"{where}.metric: no goal on its first sub-type, so Olive's INC does not tune for accuracy (inc_quantize)")
        return False
    entry, ranked = translate_metric({**metric, "sub_types": subs[:1]}, f"{where}.metric", ctx)
    if entry is None or not ranked:
        ctx.skip(f"{where}.metric", "not a metric Kiln can evaluate: INC quantizes without accuracy-driven tuning")
        return False
    _, kiln_metric, higher, goal, _ = ranked[0]
    entry["id"] = ctx.evaluation(entry)
    config.update(validation=entry["id"], metric=kiln_metric.split(".", 1)[1], metric_goal="max" if higher else "min")
    loss = _INC_GOALS.get(str(goal.get("type")))
    if loss is None:
        ctx.skip(
            f"{where}.metric.goal",
            f"Kiln's inc_quantize_accuracy bounds a loss (max-degradation, percent-max-degradation), not {goal.get('type')}",
        )
    else:
        config.update(loss_type=loss[0], tolerable_loss=float(goal.get("value", 0)) * loss[1])
    criterion = dict(olive.get("tuning_criterion") or {})
    config.update(strategy=criterion.pop("strategy", "basic"), max_trials=int(criterion.pop("max_trials", 5)))  # Olive's defaults
    if criterion.get("timeout"):
        config["tuning_timeout_s"] = int(criterion.pop("timeout"))
    for key, value in criterion.items():
        if value not in (None, 0, "performance"):
            ctx.skip(f"{where}.tuning_criterion.{key}", "no option of Kiln's inc_quantize_accuracy for it")
    if olive.get("quant_level") not in (None, "auto"):
        config["quant_level"] = olive["quant_level"]
    ctx.notes.append(f"{where}: Olive's INC tunes for {kiln_metric} → inc_quantize_accuracy judged by evaluation '{entry['id']}'")
    return True
