"""ONNX Runtime: run ONNX models through a list of execution providers (CPU, CUDA, TensorRT, ...).

The target; its config is in ``config``, its session in ``session``, the program that opens a
chosen model as measured in ``snippet``.

onnxruntime is imported inside the functions that use it, never at module import: the engine
imports this module to read ``Config`` when it validates a workflow, and ``engine --help`` must
stay fast (and work where onnxruntime is not installed).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.errors import KilnError, MissingDependency, SettingInapplicable, TargetUnavailable
from engine.core.target import Availability, Target, TensorSpec
from targets.onnxruntime import binding, eps, placement
from targets.onnxruntime import tensorrt as trt_cache
from targets.onnxruntime.config import ALLOW_SPINNING, OPT_LEVELS, TRT_CACHE_PATHS, OnnxRuntimeConfig, default_providers
from targets.onnxruntime.decoder import DecoderSession
from targets.onnxruntime.decoder_layout import DecoderLayout
from targets.onnxruntime.decoder_loop import graph_problem
from targets.onnxruntime.eps import CPU, CUDA, OPENVINO, TENSORRT
from targets.onnxruntime.provider_groups import cuda_provider_options, openvino_provider_options
from targets.onnxruntime.seq2seq import OrtSeq2SeqSession, open_seq2seq
from targets.onnxruntime.session import (
    OnnxRuntimeSession,
    import_onnxruntime,
    numpy_dtype_name,
    runtime_errors,
    runtime_message,
    tensor_shape,
)
from targets.onnxruntime.snippet import ort_snippet
from targets.onnxruntime.static_decoder import DECODE_FILE, StaticDecoderSession, is_static

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact


class OnnxRuntimeTarget(Target):
    runtime = "onnxruntime"
    summary = "ONNX Runtime with a chosen list of execution providers (CPU by default; CUDA, TensorRT, OpenVINO, DirectML, ...)."
    version = "1"
    #: ``genai``: a decoder folder, opened for generation with Kiln's own decode loop (``decoder``);
    #: ``seq2seq``: an encoder and a decoder with past, opened with Kiln's greedy loop (``seq2seq``)
    accepts = ("onnx", "genai", "seq2seq")
    libraries = ("onnxruntime",)

    Config = OnnxRuntimeConfig
    config: OnnxRuntimeConfig

    @classmethod
    def host_report(cls) -> list[tuple[str, bool, str]]:
        """The EP catalog on this host: (EP, available, why not / what provides it)."""
        return catalog_report()

    def availability(self) -> Availability:
        try:
            onnxruntime = import_onnxruntime()
        except MissingDependency as error:
            return Availability(False, str(error))
        problems = []
        for name in self.config.providers:
            problem = eps.availability_of(onnxruntime, name)
            if problem:
                problems.append(f"{name}: {problem}")
        if problems:
            available = ", ".join(onnxruntime.get_available_providers()) or "none"
            return Availability(False, f"{'; '.join(problems)} (onnxruntime {onnxruntime.__version__} here offers: {available})")
        return Availability(True)

    def session_options(self) -> Any:
        """The ``onnxruntime.SessionOptions`` this target's config asks for."""
        onnxruntime = import_onnxruntime()
        options = onnxruntime.SessionOptions()
        if self.config.intra_op_threads is not None:
            options.intra_op_num_threads = self.config.intra_op_threads
        if self.config.inter_op_threads is not None:
            options.inter_op_num_threads = self.config.inter_op_threads
        options.graph_optimization_level = getattr(onnxruntime.GraphOptimizationLevel, OPT_LEVELS[self.config.graph_optimization_level])
        options.execution_mode = (
            onnxruntime.ExecutionMode.ORT_PARALLEL if self.config.execution_mode == "parallel" else onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        )
        if not self.config.cpu_mem_arena:
            options.enable_cpu_mem_arena = False
        if not self.config.mem_pattern:
            options.enable_mem_pattern = False
        for key, value in self.config_entries().items():
            options.add_session_config_entry(key, value)
        # onnxruntime writes its own log to stderr; keep only errors there (a provider it dropped
        # is reported by the placement check instead).
        options.log_severity_level = 3
        placement.prepare(options, list(self.config.providers), self.config.allow_fallback)
        return options

    def config_entries(self) -> dict[str, str]:
        """The session config entries this config asks for (``allow_spinning``, ``config_entries``),
        besides the placement entries ``placement.prepare`` adds."""
        entries = dict(self.config.config_entries or {})
        if self.config.allow_spinning is not None:
            entries[ALLOW_SPINNING] = "1" if self.config.allow_spinning else "0"
        elif self._untimed and ALLOW_SPINNING not in entries:
            entries[ALLOW_SPINNING] = "0"
        return entries

    _untimed = False

    def untimed(self) -> OnnxRuntimeTarget:
        """Idle intra-op threads sleep rather than spin, unless the config says (``allow_spinning``):
        spinning buys a run some microseconds on a machine to itself, and on a shared one takes the
        cores another job needs. Measured on 2 cores, 200 runs of MiniLM at 128 tokens beside an
        OpenVINO job doing the same: 12.5 s spinning (OpenVINO's 14.4 s), 8.5 s not (10.9 s); two
        sessions taking turns in one process, 192 rows: 18.8 s against 9.6 s. The outputs are the
        same, and so is the fingerprint: it only changes how threads wait."""
        if self.config.allow_spinning is not None:
            return self
        twin = copy.copy(self)
        twin._untimed = True
        return twin

    def provider_options_for(self, model: ModelArtifact, onnxruntime_version: str) -> list[dict[str, Any]] | None:
        """The per-provider options: the raw ``provider_options`` with the typed groups (``cuda``,
        ``openvino``, ``tensorrt`` and its store cache folder) merged over them (typed values win)."""
        options = [dict(entry) for entry in self.config.provider_options] if self.config.provider_options else None
        config = self.config
        if config.cuda is None and config.openvino is None and config.tensorrt is None:
            return options
        options = options or [{} for _ in config.providers]
        if config.cuda is not None:
            index = config.providers.index(CUDA)
            options[index] = {**options[index], **cuda_provider_options(config.cuda)}
        if config.openvino is not None:
            index = config.providers.index(OPENVINO)
            options[index] = {**options[index], **openvino_provider_options(config.openvino, options[index])}
        trt = config.tensorrt
        if trt is not None:
            index = config.providers.index(TENSORRT)
            device_id = int(options[index].get("device_id", 0))
            folder = trt_cache.prepare_folder(self.cache_dir, model.digest, trt, onnxruntime_version, device_id)
            options[index] = trt_cache.options_with(options[index], trt_cache.provider_options(trt, folder))
        return options

    def open_session(self, model: ModelArtifact) -> OnnxRuntimeSession | DecoderSession | StaticDecoderSession | OrtSeq2SeqSession:
        if model.format not in self.accepts:
            raise KilnError(
                f"target '{self.id}' (onnxruntime) runs ONNX models, genai decoder folders and seq2seq folders, got a {model.format} model"
            )
        availability = self.availability()
        if not availability.ok:
            raise TargetUnavailable(f"target '{self.id}': {availability.reason}")
        onnxruntime = import_onnxruntime()
        path = model.model_file
        if not path.is_file():
            raise KilnError(f"target '{self.id}': no ONNX model file at {path}")
        if model.format == "seq2seq":
            return self._open_seq2seq(onnxruntime, model)
        session, passed = self._create(onnxruntime, model)
        in_use = list(session.get_providers())
        nodes = placement.placement_of(session)
        if not self.config.allow_fallback:
            placement.check(self.id, list(self.config.providers), in_use, nodes, self.config.min_ep_coverage)
        inputs = [TensorSpec(arg.name, numpy_dtype_name(arg.type), tensor_shape(arg.shape)) for arg in session.get_inputs()]
        outputs = [TensorSpec(arg.name, numpy_dtype_name(arg.type), tensor_shape(arg.shape)) for arg in session.get_outputs()]
        details: dict[str, Any] = {
            "runtime": "onnxruntime",
            "onnxruntime_version": onnxruntime.__version__,
            "device": self.config.device,
            "providers": in_use,
            "provider_options": {name: dict(opts) for name, opts in session.get_provider_options().items()},
            "placement": nodes,
            "ep_coverage": placement.coverage(nodes, self.config.providers[0]),
            # None means "the runtime's default" (one intra-op thread per physical core)
            "intra_op_threads": self.config.intra_op_threads,
            "inter_op_threads": self.config.inter_op_threads,
            "graph_optimization_level": self.config.graph_optimization_level,
            "execution_mode": self.config.execution_mode,
        }
        details.update(self._extra_details(passed))
        if model.format == "genai":
            layout = DecoderLayout.read(model.path, inputs)
            device, device_id = self._device_of(in_use, passed)
            graph = self.config.cuda_graph is not None
            if graph and (why := graph_problem(layout, is_static(inputs, layout))):
                raise SettingInapplicable(f"target '{self.id}': {self.config.cuda_graph} cannot apply to this decoder: {why}")
            if is_static(inputs, layout):  # a static_llm folder: prefill model.onnx, token generation decode.onnx
                decode = Path(model.path) / DECODE_FILE
                token = self._create(onnxruntime, model, decode)[0] if decode.is_file() else None
                return StaticDecoderSession(session, token, inputs, outputs, details, layout, device, device_id)
            # the decode loop binds unless io_binding is false (the naive loop, for comparison)
            return DecoderSession(session, inputs, outputs, details, layout, self.config.io_binding is not False, device, device_id, graph)
        plan = self._binding_plan(in_use, passed, outputs)
        if plan is not None:
            details["io_binding_device"] = f"{plan.device}:{plan.device_id}" if plan.device != "cpu" else "cpu"
        if self.config.cuda_graph is not None:
            details["cuda_graph"] = {"enabled_by": self.config.cuda_graph, "note": binding.STATIC_SHAPES, "captured_shapes": []}
        return OnnxRuntimeSession(session, inputs, outputs, details, plan)

    def _open_seq2seq(self, onnxruntime: Any, model: ModelArtifact) -> OrtSeq2SeqSession:
        """An encoder-decoder folder: a session per part, the settings of the decoder's recorded."""
        made: list[Any] = []

        def create(file: Path) -> Any:
            session, passed = self._create(onnxruntime, model, file)
            made.append(passed)
            return session

        opened = open_seq2seq(create, Path(model.path), {})
        in_use = list(opened._live()[1].get_providers())
        opened.details.update(
            {
                "runtime": "onnxruntime",
                "onnxruntime_version": onnxruntime.__version__,
                "device": self.config.device,
                "providers": in_use,
                "intra_op_threads": self.config.intra_op_threads,
                "inter_op_threads": self.config.inter_op_threads,
                "graph_optimization_level": self.config.graph_optimization_level,
                "execution_mode": self.config.execution_mode,
                **self._extra_details(made[-1]),
            }
        )
        return opened

    def _extra_details(self, passed: list[dict[str, Any]] | None) -> dict[str, Any]:
        """Settings in force beyond the ones every session records: only those not at their default."""
        extra: dict[str, Any] = {}
        if passed is not None:
            # what was passed per provider (``provider_options`` above is what onnxruntime reports, defaults included)
            extra["provider_options_passed"] = {name: dict(options) for name, options in zip(self.config.providers, passed, strict=True)}
        if not self.config.cpu_mem_arena:
            extra["cpu_mem_arena"] = False
        if not self.config.mem_pattern:
            extra["mem_pattern"] = False
        entries = self.config_entries()
        if not self.config.allow_fallback and CPU not in self.config.providers:
            entries[placement.DISABLE_CPU_FALLBACK] = "1"
        if entries:
            extra["config_entries"] = entries
        return extra

    def _binding_plan(self, in_use: list[str], passed: list[dict[str, Any]] | None, outputs: list[TensorSpec]) -> binding.Plan | None:
        """Where sessions bind their inputs and outputs: on the GPU when CUDA or TensorRT runs the
        model, in CPU memory otherwise; None when ``io_binding`` is off."""
        if not self.config.binds_io:
            return None
        names, dtypes = [spec.name for spec in outputs], [spec.dtype for spec in outputs]
        device, device_id = self._device_of(in_use, passed)
        return binding.Plan(device, device_id, device != "cpu" and self.config.cuda_graph is not None, names, dtypes)

    def _device_of(self, in_use: list[str], passed: list[dict[str, Any]] | None) -> tuple[str, int]:
        """Where bound inputs and outputs live: ("cuda", device id) when CUDA or TensorRT runs the
        model, ("cpu", 0) otherwise."""
        first = in_use[0] if in_use else CPU
        if first not in (CUDA, TENSORRT):
            return "cpu", 0
        device_id = 0
        if passed is not None and first in self.config.providers:
            device_id = int(passed[self.config.providers.index(first)].get("device_id", 0))
        return "cuda", device_id

    def inference_settings(self, session_details: dict[str, Any]) -> dict[str, Any]:
        """Providers in force with the options passed to each, session options, binding mode and
        CUDA graph shapes, from a measured session's ``details``. The only paths are TensorRT's
        engine and timing cache folders in Kiln's store, named under ``store_paths``."""
        details = session_details
        providers = placement.providers_to_create(list(details.get("providers") or self.config.providers), details.get("config_entries"))
        passed = details.get("provider_options_passed") or {}
        provider_options = [dict(passed.get(name, {})) for name in providers]
        store_paths = [
            f"{name}.{key}" for name, options in zip(providers, provider_options, strict=True) for key in options if key in TRT_CACHE_PATHS
        ]
        level = details.get("graph_optimization_level", self.config.graph_optimization_level)
        mode = details.get("execution_mode", self.config.execution_mode)
        settings: dict[str, Any] = {
            "runtime": "onnxruntime",
            "onnxruntime_version": details.get("onnxruntime_version"),
            "providers": providers,
            "provider_options": provider_options,
            "session_options": {
                "intra_op_num_threads": details.get("intra_op_threads"),
                "inter_op_num_threads": details.get("inter_op_threads"),
                "execution_mode": "ORT_PARALLEL" if mode == "parallel" else "ORT_SEQUENTIAL",
                "graph_optimization_level": OPT_LEVELS[level],
                "enable_cpu_mem_arena": details.get("cpu_mem_arena", True),
                "enable_mem_pattern": details.get("mem_pattern", True),
                "config_entries": dict(details.get("config_entries") or {}),
            },
            "io_binding": {"mode": details.get("io_binding", "off"), "device": details.get("io_binding_device")},
            "cuda_graph": details.get("cuda_graph"),
        }
        if store_paths:
            settings["store_paths"] = store_paths
        if details.get("decode_loop"):  # a genai decoder: Kiln's greedy decode loop (``decoder``)
            settings["decode_loop"] = {"loop": details["decode_loop"], "kv_cache": details.get("kv_cache")}
        return settings

    def snippet(self, settings: dict[str, Any], model_path: str) -> str:
        """A runnable program that opens ``model_path`` with ``settings`` as measured and, when
        the session bound its inputs and outputs, runs through I/O binding the same way."""
        return ort_snippet(settings, model_path)

    def _create(self, onnxruntime: Any, model: ModelArtifact, file: Path | None = None) -> tuple[Any, list[dict[str, Any]] | None]:
        """The InferenceSession (providers by name, or a plugin EP through its devices) and the
        provider options passed to it."""
        providers = list(self.config.providers)
        if any(name != CPU for name in providers) and hasattr(onnxruntime, "preload_dlls"):
            # onnxruntime-gpu finds the CUDA / cuDNN libraries of pip's nvidia-* packages (torch's)
            # only once they are preloaded; without it the CUDA provider silently drops out
            onnxruntime.preload_dlls()
        options = self.session_options()
        provider_options = self.provider_options_for(model, onnxruntime.__version__)
        path = str(file or model.model_file)
        try:
            if eps.is_plugin(onnxruntime, providers[0]):
                _add_plugin_devices(onnxruntime, options, providers, provider_options)
                return onnxruntime.InferenceSession(path, options), provider_options
            return onnxruntime.InferenceSession(path, options, providers=providers, provider_options=provider_options), provider_options
        except runtime_errors() as error:
            if self.config.cuda_graph is not None and placement.refused_graph_capture(error):
                raise SettingInapplicable(
                    self._graph_refusal(self._placement_without_graph(onnxruntime, path, options, provider_options))
                ) from error
            if placement.refused_cpu_fallback(error):
                raise TargetUnavailable(
                    f"target '{self.id}': some nodes can run on none of {', '.join(providers)} and CPU fallback is off "
                    f"(onnxruntime: {runtime_message(error)}); add {CPU} to providers, or {placement.OPT_OUT}"
                ) from error
            raise KilnError(f"onnxruntime could not load {path}: {type(error).__name__}: {runtime_message(error)}") from error

    def _graph_refusal(self, problem: str | None) -> str:
        return (
            f"target '{self.id}': {self.config.cuda_graph} cannot apply to this model ({problem or 'onnxruntime refused graph capture'}); "
            f"the candidate with {self.config.cuda_graph} off measures it"
        )

    def _placement_without_graph(
        self, onnxruntime: Any, path: str, options: Any, provider_options: list[dict[str, Any]] | None
    ) -> str | None:
        """Why a graph cannot be captured, from the placement of a session opened without one."""
        try:
            session = onnxruntime.InferenceSession(
                path, options, providers=list(self.config.providers), provider_options=placement.without_graph(provider_options)
            )
        except runtime_errors():  # it does not open without a graph either: the refusal says enough
            return None
        return placement.graph_capture_problem(placement.placement_of(session), self.config.providers[0])


def _add_plugin_devices(onnxruntime: Any, options: Any, providers: list[str], provider_options: list[dict[str, Any]] | None) -> None:
    """Plugin EPs are selected by device (``add_provider_for_devices``), in list order."""
    for index, name in enumerate(providers):
        devices = eps.plugin_devices(onnxruntime, name)
        if not devices:
            continue
        settings = {key: str(value) for key, value in (provider_options[index] if provider_options else {}).items()}
        options.add_provider_for_devices(devices, settings)


def catalog_report() -> list[tuple[str, bool, str]]:
    """Every catalog EP and installed plugin EP: (name (alias), usable here, reason or package)."""
    try:
        onnxruntime = import_onnxruntime()
    except MissingDependency as error:
        return [(f"{ep.name} ({ep.alias})", False, str(error)) for ep in eps.CATALOG]
    rows = []
    for ep in eps.CATALOG:
        problem = eps.availability_of(onnxruntime, ep.name)
        rows.append((f"{ep.name} ({ep.alias})", problem is None, problem or f"{ep.device}, from {ep.package}"))
    for name, dist in sorted(eps.register_plugins(onnxruntime).items()):
        if eps.lookup(name) is None:
            problem = eps.availability_of(onnxruntime, name)
            rows.append((f"{name} (plugin)", problem is None, problem or f"plugin EP from {dist}"))
    return rows


__all__ = [
    "ALLOW_SPINNING",
    "OnnxRuntimeConfig",
    "OnnxRuntimeSession",
    "OnnxRuntimeTarget",
    "catalog_report",
    "default_providers",
    "numpy_dtype_name",
]
