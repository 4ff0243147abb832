"""The ONNX Runtime target's config: providers and their typed option groups, session options,
the searched session settings' fields, and what enters the fingerprint (fields added after the
first release are left out while at their default, so older workflows keep their keys)."""

from __future__ import annotations

import platform
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from engine.core.target import TargetConfig
from targets.onnxruntime import eps
from targets.onnxruntime.eps import CPU, CUDA, OPENVINO, TENSORRT
from targets.onnxruntime.provider_groups import CudaOptions, OpenVinoEpOptions
from targets.onnxruntime.tensorrt import TensorRTOptions

OPT_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


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
TRT_CACHE_PATHS = ("trt_engine_cache_path", "trt_timing_cache_path")

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
            "Execution providers in order of preference, by full name or alias (cpu, cuda, tensorrt, tensorrt_rtx, openvino, dml, coreml, "
            "qnn, nnapi, webgpu, migraphx, rocm, vitisai, ...: `engine targets` lists them), e.g. [cuda, cpu]; a plugin EP by its full name. Default: derived from `device`."
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
