"""ONNX Runtime: run ONNX models through a list of execution providers (CPU, CUDA, TensorRT, ...).

onnxruntime is imported inside the functions that use it, never at module import: the engine
imports this module to read ``Config`` when it validates a workflow, and ``engine --help`` must
stay fast (and work where onnxruntime is not installed).
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from engine.core.errors import KilnError, MissingDependency, TargetUnavailable
from engine.core.target import Availability, Session, Target, TargetConfig, TensorSpec
from targets.onnxruntime import eps, placement
from targets.onnxruntime import tensorrt as trt_cache
from targets.onnxruntime.eps import CPU, CUDA, TENSORRT
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
    """An ``onnxruntime.InferenceSession`` behind the SDK's ``Session``."""

    def __init__(self, session: Any, inputs: list[TensorSpec], outputs: list[TensorSpec], details: dict[str, Any]) -> None:
        super().__init__(inputs=inputs, outputs=outputs, details=details)
        self._session = session

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self._session is None:
            raise KilnError("this onnxruntime session is closed")
        try:
            return list(self._session.run(None, feeds))
        except _runtime_errors() as error:
            raise KilnError(f"onnxruntime failed to run the model: {type(error).__name__}: {error}") from error

    def close(self) -> None:
        # InferenceSession has no close(); dropping the last reference frees its memory.
        self._session = None


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
_OMITTED_AT_DEFAULT = {"allow_fallback": False, "min_ep_coverage": None, "tensorrt": None}


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
        return self

    def to_json(self) -> dict[str, Any]:
        # Fields added later are left out while at their default, so the fingerprint (and so the
        # cache keys) of a workflow written before they existed stays the same.
        data = super().to_json()
        for name, default in _OMITTED_AT_DEFAULT.items():
            if data.get(name) == default:
                data.pop(name, None)
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
        # onnxruntime writes its own log to stderr; keep only errors there (a provider it dropped
        # is reported by the placement check instead).
        options.log_severity_level = 3
        placement.prepare(options, list(self.config.providers), self.config.allow_fallback)
        return options

    def provider_options_for(self, model: ModelArtifact, onnxruntime_version: str) -> list[dict[str, Any]] | None:
        """The per-provider options, with TensorRT's typed options and its store cache folder."""
        options = [dict(entry) for entry in self.config.provider_options] if self.config.provider_options else None
        trt = self.config.tensorrt
        if trt is None:
            return options
        index = self.config.providers.index(TENSORRT)
        options = options or [{} for _ in self.config.providers]
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
        session = self._create(onnxruntime, model)
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
        return OnnxRuntimeSession(session, inputs, outputs, details)

    def _create(self, onnxruntime: Any, model: ModelArtifact) -> Any:
        """The InferenceSession: providers by name, or a plugin EP through its devices."""
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
                return onnxruntime.InferenceSession(path, options)
            return onnxruntime.InferenceSession(path, options, providers=providers, provider_options=provider_options)
        except _runtime_errors() as error:
            if placement.refused_cpu_fallback(error):
                raise TargetUnavailable(
                    f"target '{self.id}': some nodes can run on none of {', '.join(providers)} and CPU fallback is off "
                    f"(onnxruntime: {error}); add {CPU} to providers, or {placement.OPT_OUT}"
                ) from error
            raise KilnError(f"onnxruntime could not load {path}: {type(error).__name__}: {error}") from error


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
