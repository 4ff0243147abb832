"""What the ONNX passes do before and after their own work, written once: import the heavy
libraries (only when the pass runs: the engine imports pass modules to validate workflows),
open the input as onnxruntime can load it, and wrap the written model in a ``PassResult``."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from engine.core import MissingDependency, ModelArtifact, PassContext, PassResult
from passes.common.graph_tools import runtime_loadable

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
    """The ONNX model the pass wrote into ``ctx.output_dir``, with the input's attributes."""
    return PassResult(model=ModelArtifact.from_folder("onnx", Path(ctx.output_dir), attrs=model.attrs), details=details, notes=notes)


def check_providers(ctx: PassContext) -> list[str]:
    """The onnxruntime execution providers a pass runs a model with while it works (to check it,
    calibrate it, or let onnxruntime rewrite it): those of the step's target when the target runs
    onnxruntime, else the CPU provider."""
    target = ctx.target
    if target is not None and getattr(target, "runtime", None) == "onnxruntime":
        providers = getattr(getattr(target, "config", None), "providers", None)
        if providers:
            return [str(name) for name in providers]
    return ["CPUExecutionProvider"]
