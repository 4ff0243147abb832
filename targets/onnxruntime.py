"""ONNX Runtime: run ONNX models through a list of execution providers on CPU or CUDA.

onnxruntime is imported inside the functions that use it, never at module import: the engine
imports this module to read ``Config`` when it validates a workflow, and ``engine --help`` must
stay fast (and work where onnxruntime is not installed).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from engine.core.errors import KilnError, MissingDependency, TargetUnavailable
from engine.core.target import Availability, Session, Target, TargetConfig, TensorSpec

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact

logger = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"

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


class OnnxRuntimeTarget(Target):
    runtime = "onnxruntime"
    summary = "ONNX Runtime with a chosen list of execution providers (CPU by default, CUDA optional)."
    version = "1"
    accepts = ("onnx",)
    libraries = ("onnxruntime",)

    class Config(TargetConfig):
        runtime: Literal["onnxruntime"] = Field(description="Runs models with ONNX Runtime.")
        device: Literal["cpu", "cuda"] = Field(
            default="cpu", description="The device: `cpu`, or `cuda` (needs onnxruntime-gpu and an NVIDIA GPU)."
        )
        providers: list[str] = Field(
            default_factory=lambda: [CPU],
            min_length=1,
            description=(
                "Execution providers in order of preference, e.g. [CUDAExecutionProvider, CPUExecutionProvider]. "
                "Default: [CPUExecutionProvider], or [CUDAExecutionProvider, CPUExecutionProvider] when device is cuda."
            ),
        )
        provider_options: list[dict[str, Any]] | None = Field(
            default=None,
            description="Options for each provider, one mapping per entry of `providers`, in the same order (e.g. {device_id: 0}).",
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
                if data.get("device") == "cuda":
                    data["providers"] = [CUDA, CPU]
            return data

        @model_validator(mode="after")
        def _check_provider_options(self) -> OnnxRuntimeTarget.Config:
            if self.provider_options is not None and len(self.provider_options) != len(self.providers):
                raise ValueError(
                    f"provider_options has {len(self.provider_options)} entries but providers has {len(self.providers)}: give one mapping per provider"
                )
            return self

    config: Config

    def availability(self) -> Availability:
        try:
            onnxruntime = _import_onnxruntime()
        except MissingDependency as error:
            return Availability(False, str(error))
        available = list(onnxruntime.get_available_providers())
        missing = [name for name in self.config.providers if name not in available]
        if missing:
            hint = " Install onnxruntime-gpu (in place of onnxruntime) and check the CUDA drivers." if CUDA in missing else ""
            if "OpenVINOExecutionProvider" in missing:
                # onnxruntime-openvino is a separate wheel that replaces the onnxruntime module, so
                # it cannot share this environment; isolated per-target environments are not built yet
                hint += (
                    " The OpenVINO execution provider comes in the onnxruntime-openvino wheel, which replaces the onnxruntime module"
                    " and so cannot live beside it; Kiln does not build isolated environments yet. Use the `openvino` runtime"
                    " (native OpenVINO) for OpenVINO on this machine."
                )
            return Availability(
                False,
                f"execution provider{'s' if len(missing) > 1 else ''} {', '.join(missing)} not available in onnxruntime "
                f"{onnxruntime.__version__} here; available: {', '.join(available) or 'none'}.{hint}",
            )
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
        # onnxruntime writes its own log to stderr; keep only errors there (a provider it dropped is
        # reported through this module's logger instead).
        options.log_severity_level = 3
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
        providers: list[Any] = list(self.config.providers)
        if any(name != CPU for name in providers) and hasattr(onnxruntime, "preload_dlls"):
            # onnxruntime-gpu finds the CUDA / cuDNN libraries of pip's nvidia-* packages (torch's)
            # only once they are preloaded; without it the CUDA provider silently drops out
            onnxruntime.preload_dlls()
        try:
            session = onnxruntime.InferenceSession(
                str(path), self.session_options(), providers=providers, provider_options=self.config.provider_options
            )
        except _runtime_errors() as error:
            raise KilnError(f"onnxruntime could not load {path}: {type(error).__name__}: {error}") from error
        in_use = list(session.get_providers())
        dropped = [name for name in self.config.providers if name not in in_use]
        if dropped:
            logger.warning("target %s: onnxruntime did not use %s (in use: %s)", self.id, ", ".join(dropped), ", ".join(in_use))
        inputs = [TensorSpec(arg.name, numpy_dtype_name(arg.type), _shape(arg.shape)) for arg in session.get_inputs()]
        outputs = [TensorSpec(arg.name, numpy_dtype_name(arg.type), _shape(arg.shape)) for arg in session.get_outputs()]
        details: dict[str, Any] = {
            "runtime": "onnxruntime",
            "onnxruntime_version": onnxruntime.__version__,
            "device": self.config.device,
            "providers": in_use,
            "provider_options": {name: dict(opts) for name, opts in session.get_provider_options().items()},
            # None means "the runtime's default" (one intra-op thread per physical core)
            "intra_op_threads": self.config.intra_op_threads,
            "inter_op_threads": self.config.inter_op_threads,
            "graph_optimization_level": self.config.graph_optimization_level,
            "execution_mode": self.config.execution_mode,
        }
        return OnnxRuntimeSession(session, inputs, outputs, details)
