"""What the ONNX passes do before and after their own work, written once: import the heavy
libraries (only when the pass runs: the engine imports pass modules to validate workflows),
open the input as onnxruntime can load it, and wrap the written model in a ``PassResult``."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from engine.core import MissingDependency, ModelArtifact, PassContext, PassResult
from passes.common.graph_tools import runtime_loadable
from passes.common.onnx_io import MODEL_FILE

if TYPE_CHECKING:
    import onnx


def require(distribution: str, pass_name: str, *modules: str) -> list[ModuleType]:
    """The named modules, imported; a missing one raises ``MissingDependency`` naming
    ``distribution`` and the pass."""
    try:
        return [importlib.import_module(name) for name in modules]
    except ImportError as error:
        raise MissingDependency(distribution, f"the {pass_name} pass") from error


@dataclass
class OnnxInput:
    workdir: Path  # the step's workdir, created
    source: Path  # the input model file, or a copy onnxruntime loads (IR version clamped)
    graph: onnx.ModelProto  # the input graph, without external data


def open_onnx_input(model: ModelArtifact, ctx: PassContext) -> OnnxInput:
    import onnx

    workdir = Path(ctx.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    source = runtime_loadable(model.model_file, workdir)
    return OnnxInput(workdir, source, onnx.load(str(source), load_external_data=False))


def onnx_output(model: ModelArtifact, ctx: PassContext, details: dict[str, Any], notes: list[str]) -> PassResult:
    """The ONNX model the pass wrote into ``ctx.output_dir``, with the input's attributes. A
    ``genai`` input (a decoder folder) gives a ``genai`` output: its other files (genai_config.json,
    the tokenizer's) are copied beside the new model.onnx, see ``copy_genai_sidecars``."""
    out = Path(ctx.output_dir)
    if model.format == "genai":
        copy_genai_sidecars(model, out)
        return PassResult(model=ModelArtifact.from_folder("genai", out, attrs=model.attrs), details=details, notes=notes)
    return PassResult(model=ModelArtifact.from_folder("onnx", out, attrs=model.attrs), details=details, notes=notes)


GENAI_CONFIG = "genai_config.json"


def copy_folder_rest(source: Path, out: Path, skip: set[str]) -> list[str]:
    """Copy every entry of ``source`` into ``out`` but those named in ``skip`` and those ``out``
    already holds (what a pass wrote); returns the names copied, sorted."""
    import shutil

    copied = []
    for item in sorted(source.iterdir()):
        if item.name in skip or (out / item.name).exists():
            continue
        if item.is_dir():
            shutil.copytree(item, out / item.name)
        else:
            shutil.copy2(item, out / item.name)
        copied.append(item.name)
    return copied


def copy_genai_sidecars(model: ModelArtifact, out: Path) -> list[str]:
    """Copy what a ``genai`` folder holds besides its model (genai_config.json, the tokenizer's
    files...) into ``out``, where a pass wrote a new model.onnx: every file of the input folder
    except model.onnx, its external-data files and the files the pass wrote. genai_config.json's
    decoder ``filename`` is set to the new model's name. Returns the names copied."""

    import onnx

    source = Path(model.path)
    model_file = model.model_file
    proto = onnx.load(str(model_file), load_external_data=False)
    external = {model_file.name}
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                external.add(Path(entry.value).name)
    copied = copy_folder_rest(source, out, external)
    config_file = out / GENAI_CONFIG
    if config_file.is_file():
        config = json.loads(config_file.read_text())
        decoder = config.get("model", {}).get("decoder", {})
        if isinstance(decoder, dict) and decoder.get("filename") != MODEL_FILE:
            decoder["filename"] = MODEL_FILE
            config_file.write_text(json.dumps(config, indent=4) + "\n")
    return copied


def check_providers(ctx: PassContext) -> list[str]:
    """The onnxruntime execution providers a pass runs a model with while it works (to check it,
    calibrate it, or let onnxruntime rewrite it): those of the step's target when the pass was
    given one that runs onnxruntime, else the CPU provider. A pass is given its target when it is
    target-dependent or its output depends on part of the target (``Pass.target_facet``); the
    others (an export's parity check, ort_quantize's calibration) work on the CPU for every target."""
    target = ctx.target
    if target is not None and getattr(target, "runtime", None) == "onnxruntime":
        providers = getattr(getattr(target, "config", None), "providers", None)
        if providers:
            return [str(name) for name in providers]
    return ["CPUExecutionProvider"]


# -- what a pass reads of the target it is planned for ----------------------------------------------
# A pass that is not target-dependent sees its target twice: at plan time through the target's
# fingerprint (``Pass.target_facet``: what of the target its output depends on) and at run time
# through ``ctx.target`` (given when the facet is not None). Both read the same two settings of an
# onnxruntime target, ``device`` and ``providers``.
CPU_PROVIDER = "CPUExecutionProvider"
#: execution providers that run a model on a GPU, with the name onnxruntime.transformers' optimizer
#: gives each (its ``provider`` argument)
GPU_PROVIDERS = {
    "CUDAExecutionProvider": "cuda",
    "TensorrtExecutionProvider": "tensorrt",
    "NvTensorRTRTXExecutionProvider": "tensorrt",
    "DmlExecutionProvider": "dml",
    "ROCMExecutionProvider": "rocm",
    "MIGraphXExecutionProvider": "migraphx",
}


@dataclass(frozen=True)
class OrtTarget:
    """The onnxruntime settings of a target: its device and execution providers, in order."""

    device: str
    providers: tuple[str, ...]

    @property
    def gpu_provider(self) -> str | None:
        """The first GPU execution provider the target asks for (a ``cuda`` device with none named:
        CUDA), else None (a CPU target)."""
        for name in self.providers:
            if name in GPU_PROVIDERS:
                return name
        return "CUDAExecutionProvider" if self.device == "cuda" else None


def _ort_target(runtime: Any, device: Any, providers: Any) -> OrtTarget | None:
    if runtime != "onnxruntime":
        return None
    names = tuple(str(name) for name in providers or ()) or (CPU_PROVIDER,)
    return OrtTarget(device=str(device or "cpu").lower(), providers=names)


def ort_target_of(fingerprint: dict[str, Any] | None) -> OrtTarget | None:
    """The onnxruntime settings of the target with this fingerprint; None when there is no target
    or it runs another runtime."""
    if not fingerprint:
        return None
    options = fingerprint.get("options") or {}
    return _ort_target(fingerprint.get("runtime"), options.get("device"), options.get("providers"))


def ort_target(ctx: PassContext) -> OrtTarget | None:
    """The onnxruntime settings of the target a running pass was given (None: none, or not onnxruntime)."""
    target = ctx.target
    if target is None:
        return None
    config = getattr(target, "config", None)
    return _ort_target(getattr(target, "runtime", None), getattr(config, "device", None), getattr(config, "providers", None))
