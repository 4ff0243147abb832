"""The onnxruntime execution providers (and their options) of the target a pass is planned for."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.core import ModelArtifact, PassContext
from passes.common.pass_io import CPU_PROVIDER as CPU
from passes.common.pass_io import ort_target


@dataclass(frozen=True)
class Providers:
    names: list[str]
    options: list[dict[str, str]] = field(default_factory=list)  # one mapping per name

    def session_options(self, onnxruntime: Any, base: Any | None = None) -> Any:
        """``SessionOptions`` with every provider added in order (``add_provider``)."""
        options = base if base is not None else onnxruntime.SessionOptions()
        for name, provider_options in zip(self.names, self.options, strict=True):
            options.add_provider(name, provider_options)
        return options

    def to_json(self) -> dict[str, Any]:
        return {"providers": self.names, "provider_options": self.options}


#: an onnxruntime-genai target's device → the execution provider ONNX Runtime GenAI runs it with
GENAI_DEVICE_PROVIDERS = {
    "cpu": CPU,
    "cuda": "CUDAExecutionProvider",
    "dml": "DmlExecutionProvider",
    "qnn": "QNNExecutionProvider",
    "webgpu": "WebGpuExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "vitisai": "VitisAIExecutionProvider",
    "tensorrt_rtx": "NvTensorRTRTXExecutionProvider",
}


def genai_providers(target: Any) -> Providers | None:
    """An onnxruntime-genai target's provider (its device's) and provider options, then the CPU
    provider; None for any other target."""
    if getattr(target, "runtime", None) != "onnxruntime-genai":
        return None
    config = getattr(target, "config", None)
    name = GENAI_DEVICE_PROVIDERS.get(str(getattr(config, "device", "cpu")), CPU)
    options = {str(key): _text(value) for key, value in (getattr(config, "provider_options", None) or {}).items()}
    return Providers([name], [options]) if name == CPU else Providers([name, CPU], [options, {}])


def target_providers(ctx: PassContext, model: ModelArtifact | None = None) -> Providers:
    """The providers and provider options of ``ctx.target`` when it runs onnxruntime, else the CPU
    provider alone. Option values are given to onnxruntime as strings, as its API takes them.
    Given the ``model``, the target's derived options come too (TensorRT's typed options and its
    engine / timing cache folder in the store, keyed by the model's digest)."""
    genai = genai_providers(ctx.target)
    if genai is not None:
        return genai
    settings = ort_target(ctx)  # the same reading of the target the graph passes use
    if settings is None:
        return Providers([CPU], [{}])
    target = ctx.target
    config = getattr(target, "config", None)
    names = list(settings.providers)
    given = getattr(config, "provider_options", None) or [{} for _ in names]
    if model is not None and hasattr(target, "provider_options_for"):
        import onnxruntime

        given = target.provider_options_for(model, onnxruntime.__version__) or given
    options = [{str(key): _text(value) for key, value in (entry or {}).items()} for entry in given]
    return Providers(names, options)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)
