"""Olive's ``input_model`` → Kiln's ``input``: every model type of olive-ai 0.13, matched as Olive
matches them (case-insensitively), becomes an input the workflow can name, or is listed with why not.

Nothing is loaded or run: a PyTorchModel's script is read as text (its loader's parameter names, a
literal io_config it returns), never imported. A model path that is not a folder or file here but
has the shape of a Hugging Face Hub repo id (``microsoft/Phi-3.5-mini-instruct``) is that Hub model,
as Olive reads it: ``input: {format: hf, model: <id>}``, which ``engine run`` fetches into the
Hugging Face cache.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from engine.olive.options import NEVER_RUN

#: Olive's task names → Kiln's (the input's ``task``); Olive's HfModel default is text-generation-with-past
TASKS = {
    "feature-extraction": "feature-extraction",
    "text-classification": "text-classification",
    "sentiment-analysis": "text-classification",
    "image-classification": "image-classification",
    "text-generation": "text-generation",
    "text-generation-with-past": "text-generation",
    "causal-lm": "text-generation",
    "causal-lm-with-past": "text-generation",
}
#: a Hugging Face Hub repo id: NAME or ORG/NAME
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
#: Olive's model types (olive.model.config.registry: case-insensitive) Kiln has no input for, and why
NO_INPUT = {
    "openvinomodel": "Kiln's inputs are hf, onnx and torch models: give the ONNX or PyTorch model the IR was made from",
    "compositemodel": "a model of several components: Kiln optimizes one model per workflow; translate each component's config",
    "diffusersmodel": "a diffusers pipeline (several models): Kiln optimizes one model per workflow; export each component",
    "distributedhfmodel": "a model split across ranks: Kiln optimizes a single model",
    "distributedonnxmodel": "a model split across ranks: Kiln optimizes a single model",
    "qnnmodel": "a QNN SDK model: Kiln's inputs are hf, onnx and torch models",
    "qairtmodel": "a QAIRT model: Kiln's inputs are hf, onnx and torch models",
    "tensorflowmodel": "a TensorFlow model: Kiln's inputs are hf, onnx and torch models",
}
HF_KEYS_DROPPED = {
    "adapter_path": "Kiln optimizes the base model: merge the adapter into it first",
    "model_attributes": "Kiln reads the model's attributes from its config.json",
    "test_model_path": "no Kiln input option for it",
    "test_model_config": "no Kiln input option for it",
    "io_config": "Kiln's export reads a Hugging Face model's inputs and outputs from the model itself",
    "generative": "no Kiln input option for it",
}
PLACEHOLDER = {"format": "onnx", "path": "model.onnx"}


def is_hub_id(text: str) -> bool:
    return bool(HUB_ID.match(text)) and not text.endswith((".onnx", ".pt", ".pth", ".bin", ".xml"))


def translate_input(model: Any, ctx: Any) -> dict[str, Any]:
    """Kiln's ``input`` for Olive's ``input_model`` (a placeholder, listed, when there is none for it)."""
    if not isinstance(model, dict):
        ctx.skip("input_model", "missing: Kiln needs an input model")
        return dict(PLACEHOLDER)
    kind = str(model.get("type") or "")
    rest = {k: v for k, v in model.items() if k != "type"}
    rest = {**rest, **(rest.pop("config", None) or {})}
    path = rest.pop("model_path", None)
    key = kind.lower()
    if not kind:
        key = "onnxmodel" if str(path or "").endswith(".onnx") else "hfmodel"
        ctx.notes.append(
            f"input_model has no type (Olive's schema asks for one): read as {'an ONNXModel' if key == 'onnxmodel' else 'an HfModel'}"
        )
    if path is not None and not isinstance(path, str):
        ctx.skip(
            "input_model.model_path", f"a {type(path).__name__} (an AzureML or registry reference): Kiln reads local models and Hub ids"
        )
        return dict(PLACEHOLDER)
    if key == "hfmodel":
        result = _hf_input(path, rest, ctx)
    elif key == "onnxmodel":
        result = _onnx_input(path, rest, ctx)
    elif key == "pytorchmodel" and not rest.get("model_loader") and path and not ctx.exists(path) and is_hub_id(path):
        # no loader to build the module from it: the Hub id names a Hugging Face model, read as one
        ctx.notes.append(f"input_model: a PyTorchModel with no model_loader, whose model_path {path} is a Hub id: read as an HfModel")
        rest.pop("model_script", None)
        result = _hf_input(path, rest, ctx)
    elif key == "pytorchmodel":
        result = _torch_input(path, rest, ctx)
    else:
        ctx.skip(
            "input_model.type", NO_INPUT.get(key) or f"no Kiln input for Olive's {kind} model (known: HfModel, PyTorchModel, ONNXModel)"
        )
        return dict(PLACEHOLDER)
    _task(rest.pop("task", None), key, result, ctx)
    for name, value in rest.items():
        if value not in (None, {}, [], False):
            ctx.skip(f"input_model.{name}", HF_KEYS_DROPPED.get(name) or "no Kiln input option for it")
    return result


def _hf_input(path: str | None, rest: dict[str, Any], ctx: Any) -> dict[str, Any]:
    load = dict(rest.pop("load_kwargs", None) or {})
    load.update(load.pop("extra_args", None) or {})
    result: dict[str, Any] = {"format": "hf"}
    if not path:
        ctx.skip("input_model.model_path", "missing: Kiln needs the model's folder or Hub id")
        result["path"] = "model"
    elif ctx.exists(path):
        result["path"] = ctx.locate(path)
    elif is_hub_id(path):
        result["model"] = path
        ctx.notes.append(f"input.model: the Hub model {path}; `engine run` fetches it into the Hugging Face cache")
    else:
        result["path"] = ctx.path(path)
        ctx.skip("input_model.model_path", f"'{path}' is neither a folder here nor a Hugging Face Hub id: point input.path at the model")
    revision = load.pop("revision", None)
    if revision and "model" in result:
        result["revision"] = str(revision)
    elif revision:
        ctx.skip("input_model.load_kwargs.revision", "the model is a local folder: a revision names a version of a Hub model")
    if load.pop("trust_remote_code", None):
        result["trust_remote_code"] = True
    attn = load.pop("attn_implementation", None)
    if attn in ("eager", "sdpa"):
        ctx.export["attn_implementation"] = attn
    elif attn:
        ctx.skip("input_model.load_kwargs.attn_implementation", f"Kiln's export loads with eager or sdpa attention, not {attn!r}")
    dtype = load.pop("torch_dtype", None)
    if dtype not in (None, "float32", "auto"):
        ctx.dtype = str(dtype)  # listed where a step exports the model (olive_import)
    for name, value in load.items():
        if value not in (None, {}, [], False):
            ctx.skip(f"input_model.load_kwargs.{name}", "no Kiln input option for it")
    return result


def _onnx_input(path: str | None, rest: dict[str, Any], ctx: Any) -> dict[str, Any]:
    text = str(path or "model.onnx")
    file_name = rest.pop("onnx_file_name", None)
    if file_name and not text.endswith(".onnx"):
        text = f"{text.rstrip('/')}/{file_name}"
    for name in ("inference_settings", "use_ort_extensions", "external_initializers_file_name", "constant_inputs_file_name"):
        if rest.get(name) in (None, {}, False):
            rest.pop(name, None)
    return {"format": "onnx", "path": ctx.locate(text)}


def _torch_input(path: str | None, rest: dict[str, Any], ctx: Any) -> dict[str, Any]:
    script, loader = rest.pop("model_script", None), rest.pop("model_loader", None)
    script_dir = rest.pop("script_dir", None)
    result: dict[str, Any] = {"format": "torch"}
    found = ctx.exists(str(script)) if script else False
    if script and loader and found:
        result["factory"] = f"{ctx.locate(str(script))}:{loader}"
        ctx.notes.append(f"input.factory runs {loader} from {script} in a worker (as Olive does); Kiln calls it with keywords only")
    elif script and loader:
        result["factory"] = f"{ctx.path(str(script))}:{loader}"
        ctx.skip("input_model.model_script", f"{script} is not there (looked beside the config and in the folders above it)")
    else:
        ctx.skip("input_model.model_loader", "Kiln's torch input is built by a function: give model_script and model_loader")
        result["factory"] = "model.py:load_model"
    tree = _parse(ctx.full(str(script))) if found else None
    if path:
        parameter = _first_parameter(tree, str(loader)) if tree is not None else None
        if parameter and ctx.exists(path):  # a local file or folder: absolute, as Olive resolves it
            result["kwargs"] = {parameter: str(ctx.full(path).resolve())}
            ctx.notes.append(f"input.kwargs.{parameter}: Olive passes model_path (made absolute) to {loader}; Kiln passes it by that name")
        elif parameter:
            result["kwargs"] = {parameter: path}
            ctx.notes.append(f"input.kwargs.{parameter}: Olive passes model_path to {loader}; Kiln passes it by that name")
            if not is_hub_id(path):
                ctx.skip("input_model.model_path", f"'{path}' is not there: Kiln passes it to {loader} as it is written")
        else:
            ctx.skip("input_model.model_path", "Olive passes it to model_loader; Kiln passes input.kwargs: set kwargs for your loader")
    if script_dir:
        ctx.notes.append(f"input_model.script_dir: Kiln puts the factory's own folder on the import path, not {script_dir}")
    if rest.pop("dummy_inputs_func", None):
        ctx.skip("input_model.dummy_inputs_func", "Kiln's factory may return (module, example_inputs) instead; " + NEVER_RUN)
    io_config = rest.pop("io_config", None) or {}
    if isinstance(io_config, str):
        literal = _literal_return(tree, io_config) if tree is not None else None
        if not isinstance(literal, dict):
            ctx.skip(
                "input_model.io_config", f"made by {io_config}() in {script}: its inputs and outputs are known by running it; " + NEVER_RUN
            )
            return result
        ctx.notes.append(f"input_model.io_config: the dict {io_config}() returns, read from {script} without running it")
        io_config = literal
    _io_config(io_config, ctx)
    return result


def _io_config(io_config: dict[str, Any], ctx: Any) -> None:
    names = io_config.get("input_names") or []
    shapes, types = io_config.get("input_shapes") or [], io_config.get("input_types") or []
    if names and shapes:
        ctx.export["input_shapes"] = dict(zip(names, shapes, strict=False))
    if names and types:
        ctx.export["input_dtypes"] = dict(zip(names, types, strict=False))
    if io_config.get("output_names"):
        ctx.export["outputs"] = list(io_config["output_names"])
    for key in io_config:
        if key not in ("input_names", "input_shapes", "input_types", "output_names", "dynamic_axes", "dynamic_shapes"):
            ctx.skip(f"input_model.io_config.{key}", "no Kiln export option for it")
    if io_config.get("dynamic_axes") or io_config.get("dynamic_shapes"):
        ctx.notes.append("io_config's dynamic axes: Kiln's export makes the batch axis dynamic (torch_export.dynamic_axes)")


def _task(task: Any, key: str, result: dict[str, Any], ctx: Any) -> None:
    if task is None:
        return
    kiln = TASKS.get(str(task).lower())
    if kiln is None:
        known = ", ".join(sorted(set(TASKS.values())))
        ctx.skip("input_model.task", f"{task!r}: Kiln's input tasks are {known}")
    elif key == "hfmodel":
        result["task"] = kiln


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name), None)


def _first_parameter(tree: ast.Module, name: str) -> str | None:
    """The name of the first parameter of the script's function ``name`` (Olive calls it with the model path)."""
    function = _function(tree, name)
    params = [a.arg for a in (function.args.posonlyargs + function.args.args)] if function else []
    return params[0] if params and params[0] not in ("self", "cls") else None


def _literal_return(tree: ast.Module, name: str) -> Any:
    """What the script's function ``name`` returns when its body is only ``return <literal>`` (read, not run)."""
    function = _function(tree, name)
    body = [s for s in function.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))] if function else []
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return None
    try:
        return ast.literal_eval(body[0].value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
