"""ONNX Runtime GenAI: run decoders in the ``genai`` format with the library's own generator.

The model folder's ``genai_config.json`` is read by ``og.Config``; this target replaces its
providers (``clear_providers`` / ``append_provider`` / ``set_provider_option``) and overlays the
session options and search options it sets (``Config.overlay``), so the folder is never edited.

Generation is greedy and runs exactly ``max_new_tokens`` tokens: the generator runs the model
(``append_tokens``: the prompt, then each chosen token) with its own key/value cache management
(a shared past/present buffer where the model's config asks for it), and the token is the argmax
of the last position's logits (``get_logits``). Choosing it here rather than through
``generate_next_token`` lets an end-of-sequence token be generated without ending the generation,
as the SDK asks, without masking it (``min_length`` would), so the continuation is the model's
unconstrained greedy one.

onnxruntime_genai is imported inside the functions that use it, never at module import.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from engine.core.errors import KilnError, MissingDependency, TargetUnavailable
from engine.core.target import Availability, Generation, GenerativeSession, Target, TargetConfig

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact

#: devices: the provider name onnxruntime-genai's config uses, its check for it (a function of
#: the module, "" where the library offers none), the package that brings it, and the ONNX Runtime
#: execution provider behind it (whose host check in targets.onnxruntime.eps says why a host cannot
#: run it: wrong OS, no driver, no NPU)
DEVICES: dict[str, tuple[str, str, str, str]] = {
    "cpu": ("cpu", "", "pip install onnxruntime-genai", "CPUExecutionProvider"),
    "cuda": ("cuda", "is_cuda_available", "pip install onnxruntime-genai-cuda (with onnxruntime-gpu)", "CUDAExecutionProvider"),
    "dml": ("dml", "is_dml_available", "pip install onnxruntime-genai-directml (Windows)", "DmlExecutionProvider"),
    "qnn": ("qnn", "is_qnn_available", "onnxruntime-genai with onnxruntime-qnn (Windows on Snapdragon)", "QNNExecutionProvider"),
    "webgpu": (
        "webgpu",
        "is_webgpu_available",
        "an onnxruntime-genai build with WebGPU (onnxruntime-genai-winml)",
        "WebGpuExecutionProvider",
    ),
    "openvino": ("OpenVINO", "is_openvino_available", "onnxruntime-genai with onnxruntime-openvino", "OpenVINOExecutionProvider"),
    "vitisai": ("VitisAI", "", "AMD's Ryzen AI software (onnxruntime-genai for Ryzen AI)", "VitisAIExecutionProvider"),
    "tensorrt_rtx": (
        "NvTensorRtRtx",
        "",
        "onnxruntime-genai-winml, or onnxruntime-genai with the onnxruntime-ep-nv-tensorrt-rtx plugin EP",
        "NvTensorRTRTXExecutionProvider",
    ),
}
OPT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


def import_genai() -> Any:
    try:
        import onnxruntime_genai
    except ImportError as error:
        raise MissingDependency("onnxruntime_genai", "the onnxruntime-genai target", "pip install onnxruntime-genai") from error
    return onnxruntime_genai


class GenaiConfig(TargetConfig):
    runtime: Literal["onnxruntime-genai"] = Field(description="Runs decoders with ONNX Runtime GenAI's generator.")
    device: Literal["cpu", "cuda", "dml", "qnn", "webgpu", "openvino", "vitisai", "tensorrt_rtx"] = Field(
        default="cpu",
        description=(
            "Where the model runs, by the execution provider onnxruntime-genai appends: cpu, cuda (onnxruntime-genai-cuda), "
            "dml (DirectML, Windows), qnn (Qualcomm NPU), webgpu, openvino (Intel CPU/GPU/NPU), vitisai (AMD Ryzen AI NPU) "
            "or tensorrt_rtx (NVIDIA RTX GPUs). `engine targets` says which this host can run and why not."
        ),
    )
    intra_op_threads: int | None = Field(
        default=None, ge=1, le=1024, description="Threads used inside one operator. Omit for the runtime default (one per physical core)."
    )
    inter_op_threads: int | None = Field(
        default=None, ge=1, le=1024, description="Threads running independent operators at once. Omit for the runtime default."
    )
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] | None = Field(
        default=None, description="How far ONNX Runtime rewrites the graph at load. Omit for the model config's (the runtime default: all)."
    )
    past_present_share_buffer: bool | None = Field(
        default=None,
        description=(
            "Keep the key/value cache in one buffer of the full length that each step writes into (past and present share it), "
            "instead of a new present per token. Omit for the model config's setting (on for GroupQueryAttention models)."
        ),
    )
    provider_options: dict[str, str] | None = Field(
        default=None,
        description="Options of the device's execution provider (set_provider_option), e.g. {enable_cuda_graph: '1'} for cuda.",
    )
    config_entries: dict[str, str] | None = Field(
        default=None, description="Session config entries (ONNX Runtime's add_session_config_entry) for the model's session."
    )


class GenaiTarget(Target):
    runtime = "onnxruntime-genai"
    summary = (
        "ONNX Runtime GenAI's generator for decoders with a key/value cache (the genai format) on CPU, CUDA, DirectML, NPUs and WebGPU."
    )
    version = "1"
    accepts = ("genai",)
    libraries = ("onnxruntime-genai", "onnxruntime")

    Config = GenaiConfig
    config: GenaiConfig

    @classmethod
    def host_report(cls) -> list[tuple[str, bool, str]]:
        """Each device: usable here, or why not."""
        rows = []
        for device, (_, _, package, _) in DEVICES.items():
            problem = _device_problem(device)
            rows.append((device, problem is None, problem or f"from {package.removeprefix('pip install ')}"))
        return rows

    def availability(self) -> Availability:
        problem = _device_problem(self.config.device)
        return Availability(False, problem) if problem else Availability(True)

    def overlay(self) -> dict[str, Any]:
        """What this target changes in the model's genai_config.json (``Config.overlay``)."""
        options: dict[str, Any] = {}
        config = self.config
        if config.intra_op_threads is not None:
            options["intra_op_num_threads"] = config.intra_op_threads
        if config.inter_op_threads is not None:
            options["inter_op_num_threads"] = config.inter_op_threads
        if config.graph_optimization_level is not None:
            options["graph_optimization_level"] = OPT_LEVELS[config.graph_optimization_level]
        if config.config_entries:
            options["config_entries"] = dict(config.config_entries)
        overlay: dict[str, Any] = {}
        if options:
            overlay["model"] = {"decoder": {"session_options": options}}
        if config.past_present_share_buffer is not None:
            overlay["search"] = {"past_present_share_buffer": config.past_present_share_buffer}
        return overlay

    def open_session(self, model: ModelArtifact) -> GenaiSession:
        if model.format not in self.accepts:
            raise KilnError(f"target '{self.id}' (onnxruntime-genai) runs decoders in the genai format, got a {model.format} model")
        availability = self.availability()
        if not availability.ok:
            raise TargetUnavailable(f"target '{self.id}': {availability.reason}")
        og = import_genai()
        if not (model.path / "genai_config.json").is_file():
            raise KilnError(f"target '{self.id}': no genai_config.json in {model.path}")
        overlay = self.overlay()
        try:
            config = og.Config(str(model.path))
            config.clear_providers()
            provider = DEVICES[self.config.device][0]
            if self.config.device != "cpu":
                config.append_provider(provider)
                for key, value in (self.config.provider_options or {}).items():
                    config.set_provider_option(provider, key, str(value))
            if overlay:
                config.overlay(json.dumps(overlay))
            loaded = og.Model(config)
        except RuntimeError as error:
            raise KilnError(f"onnxruntime-genai could not load {model.path}: {error}") from error
        search = json.loads((model.path / "genai_config.json").read_text()).get("search", {})
        details: dict[str, Any] = {
            "runtime": self.runtime,
            "onnxruntime_genai_version": og.__version__,
            "device": self.config.device,
            "model_device": str(loaded.device_type),
            "provider": DEVICES[self.config.device][0],
            "provider_options": dict(self.config.provider_options or {}),
            # None means "the runtime's default"
            "intra_op_threads": self.config.intra_op_threads,
            "inter_op_threads": self.config.inter_op_threads,
            "past_present_share_buffer": bool(search.get("past_present_share_buffer", False))
            if self.config.past_present_share_buffer is None
            else self.config.past_present_share_buffer,
            "config_overlay": overlay,
        }
        described = json.loads((model.path / "genai_config.json").read_text()).get("model", {})
        context = int(described.get("context_length") or 0)
        window = int((described.get("decoder", {}).get("sliding_window") or {}).get("window_size") or 0)
        if window and context:
            # a config that keeps transformers' default window (Gemma 2: 4096) over a shorter context
            # would ask GenAI for a cache longer than the model ("max_length (4096) cannot be greater
            # than model context_length (512)"): no layer can look further back than the context
            window = min(window, context)
        if window:
            details["sliding_window"] = window
        if context:
            details["context_length"] = context
        return GenaiSession(og, loaded, details, window, context)

    def inference_settings(self, session_details: dict[str, Any]) -> dict[str, Any]:
        details = session_details
        return {
            "runtime": self.runtime,
            "onnxruntime_genai_version": details.get("onnxruntime_genai_version"),
            "device": details.get("device", self.config.device),
            "provider_options": dict(details.get("provider_options") or {}),
            "config_overlay": dict(details.get("config_overlay") or {}),
            "search": {
                "do_sample": False,
                "past_present_share_buffer": details.get("past_present_share_buffer"),
                # the cache (max_length) must hold a sliding-window model's window
                **({"min_max_length": details["sliding_window"]} if details.get("sliding_window") else {}),
            },
        }

    def snippet(self, settings: dict[str, Any], model_path: str) -> str:
        """A runnable program: the model opened with the same provider and overlay, and a greedy
        loop choosing each token as measured."""
        device = str(settings.get("device") or "cpu")
        lines = ["import json", "", "import numpy as np", "import onnxruntime_genai as og", "", f"config = og.Config({model_path!r})"]
        lines.append("config.clear_providers()")
        provider = DEVICES[device][0] if device in DEVICES else device
        if device != "cpu":
            lines.append(f"config.append_provider({provider!r})")
            for key, value in (settings.get("provider_options") or {}).items():
                lines.append(f"config.set_provider_option({provider!r}, {key!r}, {str(value)!r})")
        if settings.get("config_overlay"):
            lines.append(f"config.overlay(json.dumps({settings['config_overlay']!r}))")
        lines += [
            "model = og.Model(config)",
            "",
            "",
            "def generate(prompt_ids, max_new_tokens):",
            "    params = og.GeneratorParams(model)",
            "    params.set_search_options(max_length=len(prompt_ids) + max_new_tokens, do_sample=False)"
            if not settings.get("search", {}).get("min_max_length")
            else f"    params.set_search_options(max_length=max(len(prompt_ids) + max_new_tokens, {settings['search']['min_max_length']}), "
            "do_sample=False)  # at least the sliding window",
            "    generator = og.Generator(model, params)",
            "    generator.append_tokens(np.asarray(prompt_ids, dtype=np.int32))",
            "    tokens = []",
            "    for _ in range(max_new_tokens):",
            "        token = int(np.argmax(generator.get_logits().reshape(-1)))  # greedy; end-of-sequence does not stop it",
            "        tokens.append(token)",
            "        if len(tokens) < max_new_tokens:",
            "            generator.append_tokens(np.asarray([token], dtype=np.int32))",
            "    return tokens",
        ]
        return "\n".join(lines) + "\n"


def _device_problem(device: str) -> str | None:
    """Why ``device`` cannot run here, or None: whether this onnxruntime-genai build has the
    provider (where the library can tell), then whether the onnxruntime it runs on has the
    execution provider behind it and this host can run it (no NVIDIA driver, not Windows, no
    Snapdragon: targets.onnxruntime.eps says which)."""
    try:
        og = import_genai()
    except MissingDependency as error:
        return str(error)
    if device == "cpu":
        return None
    _, check, package, ep = DEVICES[device]
    problems = []
    if check and not getattr(og, check, lambda: False)():
        problems.append(f"onnxruntime-genai {og.__version__} here is built without {device} support: {package}")
    import onnxruntime

    from targets.onnxruntime.eps import availability_of

    runtime = availability_of(onnxruntime, ep)
    if runtime:
        problems.append(f"{ep}: {runtime}" if not problems else runtime)
    return "; ".join(problems) or None


class GenaiSession(GenerativeSession):
    """An ``og.Model`` opened for greedy generation (see the module docstring)."""

    def __init__(self, og: Any, model: Any, details: dict[str, Any], window: int = 0, context: int = 0) -> None:
        super().__init__(inputs=[], outputs=[], details=details)
        self._og = og
        self._model = model
        #: a sliding-window model's window (at most the context): GenAI's cache holds max_length
        #: tokens, which must be at least it
        self._window = window
        #: the model's context (``model.context_length``; 0: not stated), which max_length never passes
        self._context = context

    def _live(self) -> Any:
        if self._model is None:
            raise KilnError("this onnxruntime-genai session is closed")
        return self._model

    def _generator(self, length: int) -> Any:
        if self._context and length > self._context:
            raise KilnError(
                f"a prompt and its new tokens need {length} positions, more than the model's context "
                f"(context_length {self._context} in genai_config.json): shorten the prompt or generate fewer tokens"
            )
        og = self._og
        params = og.GeneratorParams(self._live())
        params.set_search_options(max_length=max(length, self._window), do_sample=False)
        return og.Generator(self._model, params)

    def generate(self, prompt: Sequence[int], max_new_tokens: int) -> Generation:
        import numpy as np

        if not prompt:
            raise KilnError("generation needs a prompt of at least one token")
        if max_new_tokens < 1:
            raise KilnError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        try:
            generator = self._generator(len(prompt) + max_new_tokens)
            tokens: list[int] = []
            times: list[float] = []
            ids = np.asarray(prompt, dtype=np.int32)
            for _ in range(max_new_tokens):
                start = time.perf_counter()
                generator.append_tokens(ids)
                token = int(np.argmax(generator.get_logits().reshape(-1)))
                times.append(time.perf_counter() - start)
                tokens.append(token)
                ids = np.asarray([token], dtype=np.int32)
        except RuntimeError as error:
            raise KilnError(f"onnxruntime-genai failed to generate: {error}") from error
        return Generation(tokens=tokens, prefill_s=times[0], decode_s=times[1:])

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        import numpy as np

        if not ids:
            raise KilnError("logits of an empty sequence")
        try:
            generator = self._generator(len(ids) + 1)
            generator.append_tokens(np.asarray(ids, dtype=np.int32))
            logits = generator.get_output("logits")
        except RuntimeError as error:
            raise KilnError(f"onnxruntime-genai failed to compute logits: {error}") from error
        return np.asarray(logits, dtype=np.float32)[0]

    def close(self) -> None:
        self._model = None
