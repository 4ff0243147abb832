"""Translate a Microsoft Olive RunConfig (olive-ai 0.13) into a Kiln workflow.

Pure data in, data out: nothing is loaded or run. ``translate`` gives the workflow (Kiln's
shape, paths relative to the folder the workflow will be written to), the Olive keys it could not
carry over (each with its reason) and notes on approximations. Olive resolves relative paths
from the folder it runs in; they are taken here from the Olive file's folder.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.errors import InputError, Problem
from engine.olive_metrics import translate_evaluators, translate_search
from engine.olive_passes import PASSES
from engine.olive_steps import step_options
from engine.olive_systems import session_settings, translate_targets

MODEL_TYPES = ("HfModel", "PyTorchModel", "ONNXModel", "OpenVINOModel")
KILN_TASKS = ("feature-extraction", "text-classification", "image-classification")
OPENVINO_PASSES = {"OpenVINOConversion", "OpenVINOQuantization", "OpenVINOWeightCompression"}
NEVER_RUN = "user code Kiln would have to run; it is never run silently"


@dataclass
class Translation:
    workflow: dict[str, Any]
    unmapped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Context:
    source_dir: Path
    dest_dir: Path
    unmapped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, dict[str, Any]] = field(default_factory=dict)
    searching: bool = True
    export: dict[str, Any] = field(default_factory=dict)
    at: str = (
        ""  # the Olive key being translated: where a malformed value is reported  # torch_export options from a PyTorchModel's io_config
    )

    def skip(self, where: str, reason: str) -> None:
        self.unmapped.append((where, reason))

    def path(self, value: str) -> str:
        """An Olive path, relative to the folder the workflow will be written to."""
        full = Path(value) if os.path.isabs(value) else self.source_dir / value
        return Path(os.path.relpath(full.resolve(), self.dest_dir.resolve())).as_posix()

    def exists(self, value: str) -> bool:
        return (Path(value) if os.path.isabs(value) else self.source_dir / value).exists()

    def dataset(self, name: Any, where: str) -> str:
        """A Kiln dataset for an Olive data config name; an unknown or untranslatable one gets a stand-in."""
        key = plain(str(name))
        if key not in self.data:
            self.data[key] = {"source": "synthetic", "samples": 32}
            self.notes.append(f"{where}: dataset '{key}' is a synthetic stand-in; replace it with your data")
        return key


def plain(name: str) -> str:
    """A Kiln id (a plain name) from an Olive name."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_-") or "step"


def is_olive_config(data: Any) -> bool:
    """Recognisably an Olive RunConfig: passes of typed objects, or an Olive model type; no Kiln keys."""
    if not isinstance(data, dict) or "version" in data or "steps" in data:
        return False
    passes = data.get("passes")
    if isinstance(passes, dict) and passes and all(_typed(v) for v in passes.values()):
        return True
    model = data.get("input_model")
    return isinstance(model, dict) and str(model.get("type", "")).lower() in {t.lower() for t in MODEL_TYPES}


def _typed(value: Any) -> bool:
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(isinstance(i, dict) and "type" in i for i in items)


def translate(config: dict[str, Any], source: Path, dest_dir: Path | None = None) -> Translation:
    """The workflow, what was not carried over and notes; a value of a shape Olive would refuse is a located InputError."""
    ctx = Context(source.parent, dest_dir or source.parent)
    try:
        return _translate(config, source, ctx)
    except (AttributeError, TypeError, ValueError, KeyError, IndexError) as error:
        problem = Problem(
            ctx.at or "<root>",
            "a value of a type or shape Olive's schema does not accept",
            expected="what olive-ai 0.13 accepts there",
            given=f"{type(error).__name__}: {error}",
            hint="fix the value as Olive's documentation says",
            file=str(source),
        )
        raise InputError([problem]) from error


def _translate(config: dict[str, Any], source: Path, ctx: Context) -> Translation:
    engine = {**(config.get("engine") or {}), **{k: v for k, v in config.items() if k in ENGINE_KEYS}}
    ctx.searching = bool(config.get("search_strategy"))
    passes = config.get("passes") or {}
    kinds = {_pass_type(v) for v in passes.values()}
    runtime = "onnxruntime-genai" if "ModelBuilder" in kinds else "openvino" if kinds & OPENVINO_PASSES else "onnxruntime"
    workflow: dict[str, Any] = {"version": 1, "name": plain(str(config.get("workflow_id") or source.stem))}
    ctx.at = "input_model"
    workflow["input"] = _input(config.get("input_model"), ctx)
    _data(config.get("data_configs") or [], ctx)
    targets = translate_targets(config.get("systems") or {}, engine.get("target"), runtime, ctx)
    workflow["steps"], session = _steps(passes, ctx)
    if session:
        for target in targets:
            if target["runtime"] == "onnxruntime":
                target.update(session)
    workflow["targets"] = targets
    evaluate, select = translate_evaluators(config.get("evaluators") or {}, engine.get("evaluator"), runtime, ctx)
    workflow["data"] = ctx.data
    workflow["evaluate"], workflow["select"] = evaluate, select
    ctx.at = "search_strategy"
    search = translate_search(config.get("search_strategy"), ctx)
    if search:
        workflow["search"] = search
    _engine(engine, workflow, ctx)
    for key in config:
        if key not in KNOWN_KEYS and key not in ENGINE_KEYS:
            ctx.skip(key, "not an Olive 0.13 RunConfig key Kiln knows")
    if not workflow["data"]:
        del workflow["data"]
    order = ("version", "name", "input", "data", "targets", "steps", "evaluate", "select", "search", "output", "cache")
    return Translation({k: workflow[k] for k in order if k in workflow}, ctx.unmapped, ctx.notes)


KNOWN_KEYS = ("input_model", "systems", "data_configs", "evaluators", "engine", "passes", "search_strategy", "workflow_id")
ENGINE_KEYS = (
    "host",
    "target",
    "evaluator",
    "cache_dir",
    "output_dir",
    "evaluate_input_model",
    "log_severity_level",
    "ort_log_severity_level",
    "ort_py_log_severity_level",
    "log_to_file",
    "clean_cache",
    "clean_evaluation_cache",
    "packaging_config",
    "no_artifacts",
    "plot_pareto_frontier",
    "workflow_host",
    "azureml_client",
    "auto_optimizer_config",
)
_SILENT_ENGINE = ("host", "target", "evaluator", "log_severity_level", "ort_log_severity_level", "ort_py_log_severity_level", "log_to_file")


def _unmeasured_reference(workflow: dict[str, Any], ctx: Context) -> None:
    """``evaluate_input_model: false``: the reference is not measured, unless a goal is a drop from it."""
    drops = [c["metric"] for c in (workflow.get("select") or {}).get("constraints", []) if "max_drop" in c or "max_drop_ratio" in c]
    if drops:
        ctx.notes.append(
            f"engine.evaluate_input_model: false not followed: the goals on {', '.join(drops)} are drops from the input model, "
            "so Kiln measures it (the reference) first"
        )
        return
    workflow.setdefault("search", {})["reference"] = False
    ctx.notes.append(
        "engine.evaluate_input_model: false -> search.reference: false: the unoptimized model is made where an evaluation "
        "compares with it, but not measured nor chosen"
    )


def _engine(engine: dict[str, Any], workflow: dict[str, Any], ctx: Context) -> None:
    output = workflow.setdefault("output", {"keep": "best"})
    for key, value in engine.items():
        where = ctx.at = f"engine.{key}"
        if key == "evaluate_input_model" and value is False:
            _unmeasured_reference(workflow, ctx)
        if key in _SILENT_ENGINE or value in (None, False, {}):
            continue
        if key == "output_dir":
            output["dir"] = str(value)
        elif key == "cache_dir":
            workflow["cache"] = {"dir": ctx.path(str(value))}
        elif key == "evaluate_input_model":
            continue
        elif key == "plot_pareto_frontier":
            ctx.notes.append("Kiln marks the Pareto front in candidates.json and plots it in report.html")
        elif key in ("clean_cache", "clean_evaluation_cache"):
            ctx.skip(where, "Kiln's store is keyed by content and never serves stale results; to reclaim space, delete it")
        else:
            ctx.skip(where, "no Kiln equivalent (Kiln runs locally and writes the chosen model with its records)")


def _input(model: Any, ctx: Context) -> dict[str, Any]:
    if not isinstance(model, dict):
        ctx.skip("input_model", "missing: Kiln needs an input model")
        return {"format": "onnx", "path": "model.onnx"}
    kind, rest = str(model.get("type", "")), {k: v for k, v in model.items() if k != "type"}
    rest = {**rest, **(rest.pop("config", None) or {})}
    path = rest.pop("model_path", None)
    if kind.lower() == "hfmodel":
        result: dict[str, Any] = {"format": "hf", "path": ctx.path(str(path)) if path else ""}
        if path and not ctx.exists(str(path)):
            result["path"] = str(path)
            ctx.skip("input_model.model_path", f"'{path}' is not a local folder and Kiln never downloads: download it, set input.path")
    elif kind.lower() == "onnxmodel":
        result = {"format": "onnx", "path": ctx.path(str(path or "model.onnx"))}
    elif kind.lower() == "pytorchmodel":
        result = _torch_input(path, rest, ctx)
    else:
        why = "Kiln's inputs are hf, onnx and torch models: convert to ONNX and use ONNXModel" if kind == "OpenVINOModel" else ""
        ctx.skip("input_model.type", why or f"no Kiln input for Olive's {kind or 'untyped'} model")
        return {"format": "onnx", "path": ctx.path(str(path or "model.onnx"))}
    task = rest.pop("task", None)
    if task in KILN_TASKS:
        result["task"] = task
    elif task:
        ctx.skip("input_model.task", f"Kiln's tasks are {', '.join(KILN_TASKS)}")
    for key, value in rest.items():
        if value not in (None, {}, [], False):
            ctx.skip(f"input_model.{key}", "no Kiln input option for it")
    return result


def _torch_input(path: Any, rest: dict[str, Any], ctx: Context) -> dict[str, Any]:
    script, loader = rest.pop("model_script", None), rest.pop("model_loader", None)
    result: dict[str, Any] = {"format": "torch"}
    if script and loader:
        result["factory"] = f"{ctx.path(str(script))}:{loader}"
        ctx.notes.append(f"input.factory runs {loader} from {script} in a worker (as Olive does); Kiln calls it with keywords only")
    else:
        ctx.skip("input_model.model_loader", "Kiln's torch input is built by a function: give model_script and model_loader")
        result["factory"] = "model.py:load_model"
    if path:
        ctx.skip("input_model.model_path", "Olive passes it to model_loader; Kiln passes input.kwargs: set kwargs for your loader")
    rest.pop("script_dir", None)
    if rest.pop("dummy_inputs_func", None):
        ctx.skip("input_model.dummy_inputs_func", "Kiln's factory may return (module, example_inputs) instead; " + NEVER_RUN)
    io_config = rest.pop("io_config", None) or {}
    names = io_config.get("input_names") or []
    shapes, types = io_config.get("input_shapes") or [], io_config.get("input_types") or []
    if names and shapes:
        ctx.export["input_shapes"] = dict(zip(names, shapes, strict=False))
    if names and types:
        ctx.export["input_dtypes"] = dict(zip(names, types, strict=False))
    if io_config.get("output_names"):
        ctx.export["outputs"] = list(io_config["output_names"])
    for key in io_config:
        if key not in ("input_names", "input_shapes", "input_types", "output_names", "dynamic_axes"):
            ctx.skip(f"input_model.io_config.{key}", "no Kiln export option for it")
    if io_config.get("dynamic_axes"):
        ctx.notes.append("io_config.dynamic_axes: Kiln's export makes the batch axis dynamic (torch_export.dynamic_axes)")
    return result


def _data(configs: list[Any], ctx: Context) -> None:
    for index, config in enumerate(configs):
        where = ctx.at = f"data_configs[{index}]"
        if not isinstance(config, dict):
            ctx.skip(where, "not a data config object")
            continue
        name = plain(str(config.get("name", f"data{index}")))
        funcs = _user_functions(config)
        source = _user_data(config, funcs, where, ctx) if funcs else _container(config, where, ctx)
        if source is not None:
            ctx.data[name] = source


COMPONENTS = ("load_dataset_config", "pre_process_data_config", "post_process_data_config", "dataloader_config")


def _user_functions(config: dict[str, Any]) -> list[str]:
    """The functions of a data config's user_script it would call (component types, *_func)."""
    if not config.get("user_script"):
        return []
    found = [str(config[k]["type"]) for k in COMPONENTS if isinstance(config.get(k), dict) and config[k].get("type")]
    found += [str(v) for k, v in config.items() if k.endswith("_func") and v]
    return found or ["its functions"]


def _user_data(config: dict[str, Any], funcs: list[str], where: str, ctx: Context) -> dict[str, Any] | None:
    """A data config whose user_script makes the data → Kiln's ``custom`` data source, which names
    the one function it calls (nothing runs until the workflow is run)."""
    script = str(config.get("user_script", ""))
    if not ctx.exists(script) or funcs == ["its functions"]:
        ctx.skip(f"{where}.user_script", f"{script}: no data function named, or the file is missing; " + NEVER_RUN)
        return None
    load = config.get("load_dataset_config") or {}
    first = funcs[0]
    for other in funcs[1:]:
        ctx.skip(f"{where}: {other}", f"Kiln's custom data source calls one function: fold {other} into {first}")
    options = {k: v for k, v in (load.get("params") or {}).items() if k not in ("data_dir",)}
    ctx.notes.append(
        f"{where}: {script} → Kiln's custom data source, which runs {first}(model, **options) from it when the data is "
        "read; it must return {input name: array} (or that and labels): adapt it (Olive's registry is not imported)"
    )
    return {"source": "custom", "file": ctx.path(script), "function": first, "options": options}


def _container(config: dict[str, Any], where: str, ctx: Context) -> dict[str, Any] | None:
    kind = str(config.get("type") or "")
    load = config.get("load_dataset_config") or {}
    pre = config.get("pre_process_data_config") or {}
    if kind == "DummyDataContainer":
        shapes = load.get("input_shapes") or [[1, 128]]
        result = {"source": "synthetic", "samples": int(load.get("max_samples", 32))}
        if len(shapes[0]) > 1:
            result["sequence_length"] = int(shapes[0][1])
        ctx.notes.append(f"{where}: dummy data → synthetic (names, dtypes and shapes are read from the model)")
        return result
    if kind in ("HuggingfaceContainer", "TextGenerationContainer"):
        files = load.get("data_files")
        file = files if isinstance(files, str) else (files[0] if isinstance(files, list) and len(files) == 1 else None)
        suffix = Path(str(file)).suffix if file else ""
        if file and ctx.exists(str(file)) and suffix in (".csv", ".json", ".jsonl", ".txt"):
            return _local_file(str(file), suffix, pre, config, ctx)
        ctx.skip(
            f"{where}.load_dataset_config",
            "a Hugging Face hub dataset: Kiln never downloads; save it as csv/jsonl/text and point a data source at it",
        )
        return None
    if kind == "RawDataContainer":
        ctx.skip(f"{where}", "raw binary files: convert them to one .npz (an array per input) and use Kiln's npz source")
        return None
    ctx.skip(f"{where}.type", f"no Kiln data source for Olive's {kind or 'untyped'} container")
    return None


def _local_file(file: str, suffix: str, pre: dict[str, Any], config: dict[str, Any], ctx: Context) -> dict[str, Any]:
    path = ctx.path(file)
    if suffix == ".txt":
        result: dict[str, Any] = {"source": "text_lines", "path": path, "tokenizer": "input"}
    else:
        result = {"source": "csv" if suffix == ".csv" else "jsonl", "path": path}
        cols = pre.get("input_cols") or []
        if cols:
            result["text_column"] = cols[0]
        if pre.get("label_col"):
            result["label_column"] = pre["label_col"]
    if pre.get("max_length") or pre.get("max_seq_len"):
        result["max_length"] = int(pre.get("max_length") or pre["max_seq_len"])
    if pre.get("max_samples"):
        result["split"] = {"take": "first", "count": int(pre["max_samples"])}
    return result


def _pass_type(value: Any) -> str:
    first = value[0] if isinstance(value, list) and value else value
    return str(first.get("type", "")) if isinstance(first, dict) else ""


def _steps(passes: dict[str, Any], ctx: Context) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    session: dict[str, Any] = {}
    for name, value in passes.items():
        ctx.at = f"passes.{name}"
        configs = value if isinstance(value, list) else [value]
        kind = _pass_type(value)
        if kind == "OrtSessionParamsTuning":
            session = session_settings(configs[0], f"passes.{name}", ctx)
            continue
        spec = PASSES.get(kind)
        if spec is None or spec.kiln is None:
            reason = spec.reason if spec else f"no Kiln pass for Olive's {kind}: the chain goes on without it"
            ctx.skip(f"passes.{name}", reason)
            continue
        step: dict[str, Any] = {"id": plain(name), "pass": spec.kiln}
        if steps:
            step["after"] = steps[-1]["id"]
        config, search = step_options(spec, configs, f"passes.{name}", ctx)
        if spec.kiln == "ort_fusion" and "model_type" not in config:
            ctx.notes.append(f"passes.{name}: Olive reads model_type from the model; Kiln's ort_fusion defaults to bert")
        if spec.kiln == "torch_export":
            config = {**ctx.export, **config}
        if config:
            step["config"] = config
        if search:
            step["search"] = search
        steps.append(step)
    return steps, session


__all__ = ["Translation", "is_olive_config", "translate"]
