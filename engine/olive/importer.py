"""Translate a Microsoft Olive RunConfig (olive-ai 0.13) into a Kiln workflow.

Pure data in, data out: nothing is loaded or run. ``translate`` gives the workflow (Kiln's
shape, paths relative to the folder the workflow will be written to), the Olive keys it could not
carry over (each with its reason) and notes on approximations. Olive resolves relative paths
from the folder it runs in; they are taken here from the Olive file's folder, else from the
nearest of the two folders above it that has them (where recipes are run from).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.config import ID_MAX_LENGTH
from engine.core.errors import InputError, Problem
from engine.olive.chain import task_refused, translate_steps
from engine.olive.data import translate_data
from engine.olive.inputs import NO_INPUT, translate_input
from engine.olive.metrics import translate_evaluators, translate_search
from engine.olive.systems import translate_targets

#: Olive's model types, lower-cased: Olive matches them case-insensitively
MODEL_TYPES = ("hfmodel", "pytorchmodel", "onnxmodel", *NO_INPUT)
#: hex characters of the hash that keeps a shortened workflow name apart from others sharing its head
NAME_HASH_CHARS = 8
#: what Olive calibrates a Hugging Face model's GPTQ-style pass on when it is given no data
OLIVE_DEFAULT_CALIBRATION = {
    "source": "hf_dataset",
    "name": "wikitext",
    "config": "wikitext-2-raw-v1",
    "hf_split": "train[:1000]",
    "text_column": "text",
    "join": True,
    "max_length": 2048,
    "limit": 128,
}
#: how far up from the Olive file a relative path is looked for: recipes are often run from a parent folder
PARENT_LEVELS = 2


@dataclass
class Translation:
    workflow: dict[str, Any]
    unmapped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)  # what Kiln's validator says of the workflow (engine.olive.cli)


@dataclass
class Context:
    source_dir: Path
    dest_dir: Path
    unmapped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, dict[str, Any]] = field(default_factory=dict)
    searching: bool = True
    export: dict[str, Any] = field(default_factory=dict)  # torch_export options from the input model (io_config, load_kwargs)
    evaluations: list[dict[str, Any]] = field(default_factory=list)  # evaluations a pass needs (INC's accuracy metric)
    noted: set[str] = field(default_factory=set)
    dtype: str | None = None  # the dtype Olive loads a Hugging Face model in (load_kwargs.torch_dtype)
    at: str = ""  # the Olive key being translated: where a malformed value is reported
    qnn: bool = False  # the target system runs QNN's provider: Olive quantizes statically with QNN's rules
    split_info: dict[str, Any] | None = None  # what a CaptureSplitInfo recorded, for the SplitModel after it
    input_format: str = ""  # the translated input's format: a Hub dataset's text is tokenized with an hf input's tokenizer

    def skip(self, where: str, reason: str) -> None:
        self.unmapped.append((where, reason))

    def note_once(self, topic: str, text: str) -> None:
        if topic not in self.noted:
            self.noted.add(topic)
            self.notes.append(text)

    def full(self, value: str) -> Path:
        """An Olive path made absolute: beside the Olive file, else in a folder above it that has it
        (Olive resolves paths from the folder it runs in, and recipes are run from their parent folders)."""
        if os.path.isabs(value):
            return Path(value)
        for level in range(PARENT_LEVELS + 1):
            base = self.source_dir.joinpath(*[".."] * level)
            if (base / value).exists():
                if level:
                    self.note_once(f"base {level}", f"relative paths found {level} folder(s) above the Olive file, where Olive is run from")
                return base / value
        return self.source_dir / value

    def path(self, value: str) -> str:
        """An Olive path, relative to the folder the workflow will be written to."""
        full = Path(value) if os.path.isabs(value) else self.source_dir / value
        return Path(os.path.relpath(full.resolve(), self.dest_dir.resolve())).as_posix()

    def locate(self, value: str) -> str:
        """As ``path``, found where Olive would find it (``full``)."""
        return Path(os.path.relpath(self.full(value).resolve(), self.dest_dir.resolve())).as_posix()

    def exists(self, value: str) -> bool:
        return self.full(value).exists()

    @staticmethod
    def plain(name: str) -> str:
        return plain(name)

    def evaluation(self, entry: dict[str, Any]) -> str:
        """Add an evaluation a pass needs; its id (made unique)."""
        wanted, index = entry["id"], 2
        while any(e["id"] == entry["id"] for e in self.evaluations):
            entry["id"], index = f"{wanted}_{index}", index + 1
        self.evaluations.append(entry)
        return str(entry["id"])

    def default_text_calibration(self, where: str) -> str:
        """The data Olive calibrates a Hugging Face model's GPTQ-style pass on when the pass names none
        (olive's get_calibration_data_config: wikitext-2-raw-v1 train[:1000], joined into 128 samples of
        2048 tokens), as an hf_dataset; its id."""
        if self.input_format != "hf":
            return self.dataset("calibration", where)
        key = "wikitext2_calibration"
        if key not in self.data:
            self.data[key] = dict(OLIVE_DEFAULT_CALIBRATION)
            self.notes.append(
                f"{where}: none given: Olive's default calibration data (wikitext-2-raw-v1 train[:1000], joined into 128 samples "
                f"of 2048 tokens) → hf_dataset '{key}'; fetch it with `hf download wikitext --repo-type dataset`"
            )
        return key

    def dataset(self, name: Any, where: str) -> str:
        """A Kiln dataset for an Olive data config name; an unknown or untranslatable one gets a stand-in."""
        key = plain(str(name))
        if key not in self.data:
            self.data[key] = {"source": "synthetic", "samples": 32}
            self.notes.append(f"{where}: dataset '{key}' is a synthetic stand-in; replace it with your data")
        return key


def _runs_qnn(systems: Any, target: Any) -> bool:
    """Whether the system Olive's engine runs on (``engine.target``, else any system) has QNN's
    execution provider, which makes Olive's static quantization use QNN's rules."""
    if not isinstance(systems, dict):
        return False
    chosen = [systems[target]] if isinstance(target, str) and isinstance(systems.get(target), dict) else list(systems.values())
    for system in chosen:
        for accelerator in ((system or {}).get("config") or system or {}).get("accelerators") or []:
            if isinstance(accelerator, dict) and "QNNExecutionProvider" in (accelerator.get("execution_providers") or []):
                return True
    return False


def plain(name: str) -> str:
    """A Kiln id (a plain name) from an Olive name."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_-") or "step"


def workflow_name(name: str) -> str:
    """A workflow name Kiln's validator accepts, stable for a given Olive name: the plain name when it fits
    (a letter first, at most ID_MAX_LENGTH characters), else its head and a short hash of the whole name."""
    text = plain(name)
    if not text[0].isalpha():
        text = f"olive-{text}"
    if len(text) <= ID_MAX_LENGTH:
        return text
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:NAME_HASH_CHARS]
    head = text[: ID_MAX_LENGTH - NAME_HASH_CHARS - 1].rstrip("_-")
    return f"{head}-{digest}"


def is_olive_config(data: Any) -> bool:
    """Recognisably an Olive RunConfig: passes of typed objects, or an Olive model type; no Kiln keys."""
    if not isinstance(data, dict) or "version" in data or "steps" in data:
        return False
    passes = data.get("passes")
    if isinstance(passes, dict) and passes and all(_typed(v) for v in passes.values()):
        return True
    model = data.get("input_model")
    if not isinstance(model, dict):
        return False
    # an Olive model type, or any input model (untyped, another type) beside Olive's passes
    return str(model.get("type", "")).lower() in MODEL_TYPES or (isinstance(passes, dict) and bool({"type", "model_path"} & set(model)))


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
    full_name = str(config.get("workflow_id") or source.stem)
    workflow: dict[str, Any] = {"version": 1, "name": workflow_name(full_name)}
    if workflow["name"] != plain(full_name):
        workflow["description"] = f"Olive workflow {full_name!r}, named to fit Kiln's rule ({ID_MAX_LENGTH} characters at most)"
    ctx.at = "input_model"
    workflow["input"] = translate_input(config.get("input_model"), ctx)
    ctx.input_format = str(workflow["input"].get("format", ""))
    translate_data(config.get("data_configs") or [], ctx)
    ctx.qnn = _runs_qnn(config.get("systems") or {}, engine.get("target"))
    workflow["steps"], session = translate_steps(passes, workflow["input"]["format"], ctx)
    _check_input(workflow, ctx)
    runtime = _runtime(workflow["steps"])
    targets = translate_targets(config.get("systems") or {}, engine.get("target"), runtime, ctx)
    if session:
        for target in targets:
            if target["runtime"] == "onnxruntime":
                target.update(session)
    workflow["targets"] = targets
    evaluate, select = translate_evaluators(config.get("evaluators") or {}, engine.get("evaluator"), runtime, ctx)
    for entry in ctx.evaluations:  # the evaluations a pass judges models by, made unique against the others
        while any(e["id"] == entry["id"] for e in evaluate):
            entry["id"] = f"{entry['id']}_pass"
        evaluate.append(entry)
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
    order = ("version", "name", "description", "input", "data", "targets", "steps", "evaluate", "select", "search", "output", "cache")
    return Translation({k: workflow[k] for k in order if k in workflow}, ctx.unmapped, ctx.notes)


def _runtime(steps: list[dict[str, Any]]) -> str:
    """The runtime the last step's model runs on: ONNX Runtime GenAI after a genai build, OpenVINO after an
    OpenVINO conversion (Olive evaluates an OpenVINO model with OpenVINO), else ONNX Runtime."""
    last = steps[-1]["pass"] if steps else ""
    if last in ("genai_build", "decoder_export") or any(s["pass"] == "genai_build" for s in steps):
        return "onnxruntime-genai"
    if last == "openvino_encapsulate":  # an EPContext model: ONNX Runtime's OpenVINO execution provider runs it
        return "onnxruntime"
    if last.startswith(("openvino", "nncf")):
        return "openvino"
    return "onnxruntime"


def _check_input(workflow: dict[str, Any], ctx: Context) -> None:
    """What of the input depends on the steps that read it: the task goes to the steps that take it from
    the input (one they refuse is listed, not kept); Olive's load dtype matters only to an export."""
    model = workflow["input"]
    task = model.get("task")
    exports = [s["pass"] for s in workflow["steps"] if not s.get("after") and s["pass"] in ("torch_export", "openvino_convert")]
    if task:
        refused = task_refused(workflow["steps"], task)
        if refused:
            del model["task"]
            ctx.skip("input_model.task", refused)
    elif model["format"] == "hf" and "torch_export" in exports:
        ctx.skip(
            "input_model.task",
            "not given: Olive exports an HfModel as text-generation-with-past (its default task), with its LM head and past "
            "key values; Kiln's torch_export exports feature-extraction (AutoModel); decoder_export exports a causal LM with its KV cache",
        )
    if ctx.dtype and exports:
        ctx.skip(
            "input_model.load_kwargs.torch_dtype",
            f"Kiln's {exports[0]} loads the model in float32 ({ctx.dtype} not carried): add an fp16 step",
        )
    elif ctx.dtype:
        ctx.notes.append(f"input_model.load_kwargs.torch_dtype {ctx.dtype}: no step here loads the PyTorch model for its weights' type")


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
        elif key == "no_artifacts":
            ctx.skip(where, "Kiln always writes the chosen model with its records (candidates.json, report.html)")
        elif key in ("clean_cache", "clean_evaluation_cache"):
            ctx.skip(where, "Kiln's store is keyed by content and never serves stale results; to reclaim space, delete it")
        else:
            ctx.skip(where, "no Kiln equivalent (Kiln runs locally and writes the chosen model with its records)")


__all__ = ["Translation", "is_olive_config", "translate"]
