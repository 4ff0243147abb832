"""ONNX Runtime: run ONNX models through a list of execution providers (CPU, CUDA, TensorRT, ...).

onnxruntime is imported inside the functions that use it, never at module import: the engine
imports this module to read ``Config`` when it validates a workflow, and ``engine --help`` must
stay fast (and work where onnxruntime is not installed).
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from engine.core.errors import KilnError, MissingDependency, TargetUnavailable
from engine.core.target import Availability, Session, Target, TargetConfig, TensorSpec
from targets.onnxruntime import binding, eps, placement
from targets.onnxruntime import tensorrt as trt_cache
from targets.onnxruntime.eps import CPU, CUDA, OPENVINO, TENSORRT
from targets.onnxruntime.provider_groups import CudaOptions, OpenVinoEpOptions, cuda_provider_options, openvino_provider_options
from targets.onnxruntime.tensorrt import TensorRTOptions

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact

#: ONNX Runtime's element type names (``tensor(float)``) → numpy dtype names
_ORT_DTYPES: dict[str, str] = {
    "float": "float32",
    "float16": "float16",
    "double": "float64",
    "bfloat16": "bfloat16",  # no numpy dtype; kept so a user sees what the model wants
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "bool": "bool",
    "string": "object",
}

_OPT_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


def numpy_dtype_name(ort_type: str) -> str:
    """``tensor(int64)`` → ``int64``, ``tensor(float)`` → ``float32``; a non-tensor type
    (``seq(tensor(float))``, ``map(...)``) is returned unchanged."""
    if ort_type.startswith("tensor(") and ort_type.endswith(")"):
        element = ort_type[len("tensor(") : -1]
        return _ORT_DTYPES.get(element, element)
    return ort_type


def _shape(dims: Any) -> tuple[int | str | None, ...]:
    if dims is None:  # a tensor of unknown rank
        return ()
    shape: list[int | str | None] = []
    for dim in dims:
        if isinstance(dim, int) and dim >= 0:
            shape.append(dim)
        elif isinstance(dim, str) and dim:
            shape.append(dim)
        else:
            shape.append(None)
    return tuple(shape)


def _import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError as error:
        raise MissingDependency("onnxruntime", "the onnxruntime target", "pip install onnxruntime (or onnxruntime-gpu for CUDA)") from error
    return onnxruntime


def _runtime_errors() -> tuple[type[BaseException], ...]:
    """What onnxruntime raises on a model it cannot load or run: its pybind exceptions derive
    directly from ``Exception``, and its Python layer adds ValueError / RuntimeError."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = (
        "Fail",
        "InvalidArgument",
        "NoSuchFile",
        "NoModel",
        "EngineError",
        "RuntimeException",
        "InvalidProtobuf",
        "NotImplemented",
        "InvalidGraph",
        "EPFail",
    )
    found = tuple(getattr(state, name) for name in names if isinstance(getattr(state, name, None), type))
    return (*found, ValueError, RuntimeError)


class OnnxRuntimeSession(Session):
    """An ``onnxruntime.InferenceSession`` behind the SDK's ``Session``; with a binding ``plan``
    (the target's ``io_binding``) runs go through ONNX Runtime I/O binding (see ``binding``)."""

    def __init__(
        self,
        session: Any,
        inputs: list[TensorSpec],
        outputs: list[TensorSpec],
        details: dict[str, Any],
        plan: binding.Plan | None = None,
    ) -> None:
        super().__init__(inputs=inputs, outputs=outputs, details=details)
        self._session = session
        self._plan = plan
        self._binder = binding.Binder(session, plan, _runtime_errors()) if plan is not None else None
        self.details.setdefault("io_binding", plan.mode if plan is not None else "off")

    def _live(self) -> Any:
        if self._session is None:
            raise KilnError("this onnxruntime session is closed")
        return self._session

    def _record_graphs(self) -> None:
        if self._plan is not None and self._plan.cuda_graph:
            graph = self.details.setdefault("cuda_graph", {"note": binding.STATIC_SHAPES, "captured_shapes": []})
            graph["captured_shapes"] = [{name: list(shape) for name, shape, _ in signature} for signature in self._plan.captured]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        session = self._live()
        if self._binder is not None:
            try:
                return self._binder.run(feeds)
            finally:
                self._record_graphs()
        try:
            return list(session.run(None, feeds))
        except _runtime_errors() as error:
            raise KilnError(f"onnxruntime failed to run the model: {type(error).__name__}: {error}") from error

    def prepare(self, feeds: dict[str, np.ndarray]) -> Callable[[], None]:
        """With I/O binding: ``feeds`` copied to the device once, outputs allocated by a first
        run; the call returned only runs (results stay in the bound outputs). Without it, the
        SDK's default (a host-to-host ``run``)."""
        self._live()
        if self._binder is None:
            return super().prepare(feeds)
        binder = self._binder
        try:
            bound = binder.bind(feeds)
        finally:
            self._record_graphs()

        def run() -> None:
            binder.last = bound
            binder.execute(bound)

        return run

    def concurrent(self) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
        """ONNX Runtime's ``run`` is safe to call from several threads; bound runs are not (their
        OrtValues are rewritten), so each caller gets bindings of its own."""
        session = self._live()
        if self._plan is None:
            return self.run
        return binding.Binder(session, self._plan, _runtime_errors()).run

    def synchronize(self) -> None:
        if self._binder is not None:
            self._binder.synchronize()

    def close(self) -> None:
        # InferenceSession has no close(); dropping the last reference frees its memory.
        self._session = None
        self._binder = None


def default_providers(device: str) -> list[str]:
    """The provider list a device kind means when ``providers`` is not given."""
    system = platform.system()
    if device == "cuda":
        return [CUDA, CPU]
    if device == "gpu":
        gpu = {"Windows": "DmlExecutionProvider", "Darwin": "CoreMLExecutionProvider"}.get(system, CUDA)
        return [gpu, CPU]
    if device == "npu":
        return ["CoreMLExecutionProvider" if system == "Darwin" else "QNNExecutionProvider", CPU]
    return [CPU]


#: fields added after the first release; left out of ``to_json`` while at their default
_OMITTED_AT_DEFAULT: dict[str, Any] = {
    "allow_fallback": False,
    "min_ep_coverage": None,
    "tensorrt": None,
    "cpu_mem_arena": True,
    "mem_pattern": True,
    "allow_spinning": None,
    "config_entries": None,
    "io_binding": None,
    "cuda": None,
    "openvino": None,
}

#: TensorRT options that name folders in Kiln's store
_TRT_CACHE_PATHS = ("trt_engine_cache_path", "trt_timing_cache_path")

#: the session config entry behind ``allow_spinning``
ALLOW_SPINNING = "session.intra_op.allow_spinning"


class OnnxRuntimeConfig(TargetConfig):
    runtime: Literal["onnxruntime"] = Field(description="Runs models with ONNX Runtime.")
    device: Literal["cpu", "cuda", "gpu", "npu"] = Field(
        default="cpu",
        description=(
            "The device kind: `cpu`, `cuda` (NVIDIA, needs onnxruntime-gpu), `gpu` (the platform's GPU EP: CUDA on Linux, "
            "DirectML on Windows, CoreML on macOS) or `npu` (QNN, or CoreML on macOS). It sets the default `providers`."
        ),
    )
    providers: list[str] = Field(
        default_factory=lambda: [CPU],
        min_length=1,
        description=(
            "Execution providers in order of preference, by full name or alias (cpu, cuda, tensorrt, openvino, dml, coreml, qnn, "
            "nnapi, webgpu), e.g. [cuda, cpu]; a plugin EP by its full name. Default: derived from `device`."
        ),
    )
    provider_options: list[dict[str, Any]] | None = Field(
        default=None,
        description="Options for each provider, one mapping per entry of `providers`, in the same order (e.g. {device_id: 0}).",
    )
    allow_fallback: bool = Field(
        default=False,
        description=(
            "Accept a session whose first-choice provider was dropped or took no node (results then come from the next "
            "provider). Off by default: such a candidate fails with the reason."
        ),
    )
    min_ep_coverage: float | None = Field(
        default=None, ge=0, le=1, description="Least share of the graph's nodes (0..1) the first-choice provider must take."
    )
    tensorrt: TensorRTOptions | None = Field(
        default=None,
        description="TensorRT options (fp16, int8, engine_cache, timing_cache, ...); needs TensorrtExecutionProvider in providers.",
    )
    intra_op_threads: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Threads used inside one operator. Omit to let ONNX Runtime choose (one per physical core).",
    )
    inter_op_threads: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Threads running independent operators at once; used only when execution_mode is parallel. Omit for the runtime default.",
    )
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = Field(
        default="all", description="How far ONNX Runtime rewrites the graph when it loads the model (its GraphOptimizationLevel)."
    )
    execution_mode: Literal["sequential", "parallel"] = Field(
        default="sequential", description="Run operators one after another, or independent branches in parallel."
    )
    cpu_mem_arena: bool = Field(default=True, description="Keep a memory arena for CPU allocations (SessionOptions.enable_cpu_mem_arena).")
    mem_pattern: bool = Field(
        default=True,
        description="Plan memory ahead from the allocation pattern of earlier runs with the same shapes (SessionOptions.enable_mem_pattern).",
    )
    allow_spinning: bool | None = Field(
        default=None,
        description=f"Let intra-op threads spin while waiting for work ({ALLOW_SPINNING}); omit for the runtime default (on).",
    )
    config_entries: dict[str, str] | None = Field(
        default=None,
        description="More session config entries (SessionOptions.add_session_config_entry), e.g. {session.set_denormal_as_zero: '1'}.",
    )
    io_binding: bool | None = Field(
        default=None,
        description=(
            "Bind inputs and outputs on the session's device (ONNX Runtime I/O binding: inputs copied there once, outputs "
            "pre-allocated and reused). Omit for automatic: on when a CUDA graph is enabled (which needs it), off otherwise."
        ),
    )
    cuda: CudaOptions | None = Field(
        default=None,
        description="CUDA options (cudnn_conv_algo_search, enable_cuda_graph, use_tf32, ...); needs CUDAExecutionProvider in providers.",
    )
    openvino: OpenVinoEpOptions | None = Field(
        default=None,
        description="OpenVINO EP options (device_type, precision, num_streams, performance_hint, ...); needs OpenVINOExecutionProvider in providers.",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_providers(cls, data: Any) -> Any:
        # The default provider list depends on the device, so it is filled in before validation
        # and the resolved list is what enters the target's fingerprint.
        if isinstance(data, dict) and data.get("providers") is None:
            data = {key: value for key, value in data.items() if key != "providers"}
            device = data.get("device")
            if isinstance(device, str) and device != "cpu":
                data["providers"] = default_providers(device)
        return data

    @field_validator("providers", mode="after")
    @classmethod
    def _full_names(cls, providers: list[str]) -> list[str]:
        # aliases become full names here, before the fingerprint is taken: `cuda` and
        # `CUDAExecutionProvider` are the same target
        names = [eps.normalize(name) for name in providers]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} is listed more than once")
        return names

    @model_validator(mode="after")
    def _check_provider_options(self) -> OnnxRuntimeConfig:
        if self.provider_options is not None and len(self.provider_options) != len(self.providers):
            raise ValueError(
                f"provider_options has {len(self.provider_options)} entries but providers has {len(self.providers)}: give one mapping per provider"
            )
        if self.tensorrt is not None and TENSORRT not in self.providers:
            raise ValueError(f"`tensorrt` options need {TENSORRT} (alias tensorrt) in providers")
        if self.cuda is not None and CUDA not in self.providers:
            raise ValueError(f"`cuda` options need {CUDA} (alias cuda) in providers")
        if self.openvino is not None and OPENVINO not in self.providers:
            raise ValueError(f"`openvino` options need {OPENVINO} (alias openvino) in providers")
        if self.io_binding is False and self.cuda_graph:
            raise ValueError(
                f"{self.cuda_graph} is on but io_binding is false: CUDA graphs need I/O binding (inputs and outputs at fixed "
                "device addresses); leave io_binding out or set it true"
            )
        return self

    @property
    def cuda_graph(self) -> str | None:
        """Which option turns a CUDA graph on (``cuda.enable_cuda_graph`` / ``tensorrt.cuda_graph``), or None."""
        if self.cuda is not None and self.cuda.enable_cuda_graph:
            return "cuda.enable_cuda_graph"
        if self.tensorrt is not None and self.tensorrt.cuda_graph:
            return "tensorrt.cuda_graph"
        return None

    @property
    def binds_io(self) -> bool:
        """Whether sessions bind inputs and outputs (``io_binding``, or automatic with a CUDA graph)."""
        return self.io_binding if self.io_binding is not None else self.cuda_graph is not None

    def to_json(self) -> dict[str, Any]:
        # Fields added later are left out while at their default, so the fingerprint (and so the
        # cache keys) of a workflow written before they existed stays the same.
        data = super().to_json()
        for name, default in _OMITTED_AT_DEFAULT.items():
            if data.get(name) == default:
                data.pop(name, None)
        # option groups carry only what they set (their own to_json)
        for name in ("tensorrt", "cuda", "openvino"):
            group = getattr(self, name)
            if group is not None:
                data[name] = group.to_json()
        # io_binding written as what "automatic" resolves to is the same target as leaving it out
        if self.io_binding is not None and self.io_binding == (self.cuda_graph is not None):
            data.pop("io_binding", None)
        return data


class OnnxRuntimeTarget(Target):
    runtime = "onnxruntime"
    summary = "ONNX Runtime with a chosen list of execution providers (CPU by default; CUDA, TensorRT, OpenVINO, DirectML, ...)."
    version = "1"
    accepts = ("onnx",)
    libraries = ("onnxruntime",)

    Config = OnnxRuntimeConfig
    config: OnnxRuntimeConfig

    @classmethod
    def host_report(cls) -> list[tuple[str, bool, str]]:
        """The EP catalog on this host: (EP, available, why not / what provides it)."""
        return catalog_report()

    def availability(self) -> Availability:
        try:
            onnxruntime = _import_onnxruntime()
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
        onnxruntime = _import_onnxruntime()
        options = onnxruntime.SessionOptions()
        if self.config.intra_op_threads is not None:
            options.intra_op_num_threads = self.config.intra_op_threads
        if self.config.inter_op_threads is not None:
            options.inter_op_num_threads = self.config.inter_op_threads
        options.graph_optimization_level = getattr(onnxruntime.GraphOptimizationLevel, _OPT_LEVELS[self.config.graph_optimization_level])
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
        return entries

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

    def open_session(self, model: ModelArtifact) -> OnnxRuntimeSession:
        if model.format not in self.accepts:
            raise KilnError(f"target '{self.id}' (onnxruntime) runs ONNX models, got a {model.format} model")
        availability = self.availability()
        if not availability.ok:
            raise TargetUnavailable(f"target '{self.id}': {availability.reason}")
        onnxruntime = _import_onnxruntime()
        path = model.model_file
        if not path.is_file():
            raise KilnError(f"target '{self.id}': no ONNX model file at {path}")
        session, passed = self._create(onnxruntime, model)
        in_use = list(session.get_providers())
        nodes = placement.placement_of(session)
        if not self.config.allow_fallback:
            placement.check(self.id, list(self.config.providers), in_use, nodes, self.config.min_ep_coverage)
        inputs = [TensorSpec(arg.name, numpy_dtype_name(arg.type), _shape(arg.shape)) for arg in session.get_inputs()]
        outputs = [TensorSpec(arg.name, numpy_dtype_name(arg.type), _shape(arg.shape)) for arg in session.get_outputs()]
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
        plan = self._binding_plan(in_use, passed, outputs)
        if plan is not None:
            details["io_binding_device"] = f"{plan.device}:{plan.device_id}" if plan.device != "cpu" else "cpu"
        if self.config.cuda_graph is not None:
            details["cuda_graph"] = {"enabled_by": self.config.cuda_graph, "note": binding.STATIC_SHAPES, "captured_shapes": []}
        return OnnxRuntimeSession(session, inputs, outputs, details, plan)

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
        first = in_use[0] if in_use else CPU
        if first not in (CUDA, TENSORRT):
            return binding.Plan("cpu", 0, False, names, dtypes)
        device_id = 0
        if passed is not None and first in self.config.providers:
            device_id = int(passed[self.config.providers.index(first)].get("device_id", 0))
        return binding.Plan("cuda", device_id, self.config.cuda_graph is not None, names, dtypes)

    def inference_settings(self, session_details: dict[str, Any]) -> dict[str, Any]:
        """Providers in force with the options passed to each, session options, binding mode and
        CUDA graph shapes, from a measured session's ``details``. The only paths are TensorRT's
        engine and timing cache folders in Kiln's store, named under ``store_paths``."""
        details = session_details
        providers = list(details.get("providers") or self.config.providers)
        passed = details.get("provider_options_passed") or {}
        provider_options = [dict(passed.get(name, {})) for name in providers]
        store_paths = [
            f"{name}.{key}" for name, options in zip(providers, provider_options, strict=True) for key in options if key in _TRT_CACHE_PATHS
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
                "graph_optimization_level": _OPT_LEVELS[level],
                "enable_cpu_mem_arena": details.get("cpu_mem_arena", True),
                "enable_mem_pattern": details.get("mem_pattern", True),
                "config_entries": dict(details.get("config_entries") or {}),
            },
            "io_binding": {"mode": details.get("io_binding", "off"), "device": details.get("io_binding_device")},
            "cuda_graph": details.get("cuda_graph"),
        }
        if store_paths:
            settings["store_paths"] = store_paths
        return settings

    def snippet(self, settings: dict[str, Any], model_path: str) -> str:
        """A runnable program that opens ``model_path`` with ``settings`` as measured and, when
        the session bound its inputs and outputs, runs through I/O binding the same way."""
        return ort_snippet(settings, model_path)

    def _create(self, onnxruntime: Any, model: ModelArtifact) -> tuple[Any, list[dict[str, Any]] | None]:
        """The InferenceSession (providers by name, or a plugin EP through its devices) and the
        provider options passed to it."""
        providers = list(self.config.providers)
        if any(name != CPU for name in providers) and hasattr(onnxruntime, "preload_dlls"):
            # onnxruntime-gpu finds the CUDA / cuDNN libraries of pip's nvidia-* packages (torch's)
            # only once they are preloaded; without it the CUDA provider silently drops out
            onnxruntime.preload_dlls()
        options = self.session_options()
        provider_options = self.provider_options_for(model, onnxruntime.__version__)
        path = str(model.model_file)
        try:
            if eps.is_plugin(onnxruntime, providers[0]):
                _add_plugin_devices(onnxruntime, options, providers, provider_options)
                return onnxruntime.InferenceSession(path, options), provider_options
            return onnxruntime.InferenceSession(path, options, providers=providers, provider_options=provider_options), provider_options
        except _runtime_errors() as error:
            if placement.refused_cpu_fallback(error):
                raise TargetUnavailable(
                    f"target '{self.id}': some nodes can run on none of {', '.join(providers)} and CPU fallback is off "
                    f"(onnxruntime: {error}); add {CPU} to providers, or {placement.OPT_OUT}"
                ) from error
            raise KilnError(f"onnxruntime could not load {path}: {type(error).__name__}: {error}") from error


def ort_snippet(settings: dict[str, Any], model_path: str) -> str:
    """The program ``OnnxRuntimeTarget.snippet`` returns (see there)."""
    options = settings.get("session_options") or {}
    lines = ["import onnxruntime as ort", "", "options = ort.SessionOptions()"]
    for name in ("intra_op_num_threads", "inter_op_num_threads"):
        if options.get(name) is not None:
            lines.append(f"options.{name} = {int(options[name])}")
    lines.append(f"options.execution_mode = ort.ExecutionMode.{options.get('execution_mode', 'ORT_SEQUENTIAL')}")
    lines.append(
        f"options.graph_optimization_level = ort.GraphOptimizationLevel.{options.get('graph_optimization_level', 'ORT_ENABLE_ALL')}"
    )
    for name in ("enable_cpu_mem_arena", "enable_mem_pattern"):
        if options.get(name) is False:
            lines.append(f"options.{name} = False")
    for key, value in (options.get("config_entries") or {}).items():
        lines.append(f"options.add_session_config_entry({key!r}, {str(value)!r})")
    providers = list(settings.get("providers") or [CPU])
    provider_options = list(settings.get("provider_options") or [{} for _ in providers])
    if settings.get("store_paths"):
        lines.append(f"# {', '.join(settings['store_paths'])}: folders in Kiln's store; point them at your own")
    lines += [
        f"providers = {providers!r}",
        f"provider_options = {provider_options!r}",
        f"session = ort.InferenceSession({model_path!r}, options, providers=providers, provider_options=provider_options)",
    ]
    bind = settings.get("io_binding") or {}
    if bind.get("mode") in ("device", "host"):
        device = str(bind.get("device") or "cpu")
        name, _, index = device.partition(":")
        graph = settings.get("cuda_graph") is not None
        lines += [
            "",
            f"# I/O binding on {device}: inputs copied there once per shape and updated in place, outputs reused",
            *(["# static shapes: a CUDA graph is captured per input shape (run option gpu_graph_id)"] if graph else []),
            "bindings = {}",
            "",
            "",
            "def run(feeds):",
            "    key = tuple(sorted((name, array.shape) for name, array in feeds.items()))",
            "    if key not in bindings:",
            "        binding = session.io_binding()",
            f"        inputs = {{n: ort.OrtValue.ortvalue_from_numpy(a.copy(), {name!r}, {int(index or 0)}) for n, a in feeds.items()}}",
            "        for n, value in inputs.items():",
            "            binding.bind_ortvalue_input(n, value)",
            "        for output in session.get_outputs():",
            f"            binding.bind_output(output.name, {name!r}, {int(index or 0)})",
            "        first = ort.RunOptions()",
            *(['        first.add_run_config_entry("gpu_graph_id", "-1")  # allocate the outputs outside any graph'] if graph else []),
            "        session.run_with_iobinding(binding, first)  # tells the outputs' shapes",
            "        described = [(value.shape(), value.numpy().dtype) for value in binding.get_outputs()]",
            "        outputs = []",
            "        for output, (shape, dtype) in zip(session.get_outputs(), described):",
            f"            mine = ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, {name!r}, {int(index or 0)})",
            "            binding.bind_ortvalue_output(output.name, mine)",
            "            outputs.append(mine)",
            "        run_options = ort.RunOptions()",
            *(['        run_options.add_run_config_entry("gpu_graph_id", str(len(bindings) + 1))'] if graph else []),
            "        bindings[key] = (binding, inputs, outputs, run_options)",
            "    else:",
            "        for n, array in feeds.items():",
            "            bindings[key][1][n].update_inplace(array)",
            "    binding, _, outputs, run_options = bindings[key]",
            "    session.run_with_iobinding(binding, run_options)",
            "    return [value.numpy().copy() for value in outputs]",
        ]
    else:
        lines += ["", "# outputs = session.run(None, {input name: numpy array})"]
    return "\n".join(lines) + "\n"


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
        onnxruntime = _import_onnxruntime()
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
