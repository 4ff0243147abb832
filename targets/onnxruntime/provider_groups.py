"""Typed option groups for the CUDA and OpenVINO execution providers.

Each group is a ``StrictConfig`` whose fields are all optional: a field left out (None) leaves
ONNX Runtime's default in force and is left out of the target's fingerprint, so a search that
sets one option (``cuda.enable_cuda_graph``) moves the key only by that option. ``provider_options``
maps a group to the strings ONNX Runtime takes; the target merges them over the user's raw
``provider_options`` for the same provider (typed values win).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from engine.core.config import StrictConfig


class CudaOptions(StrictConfig):
    """CUDA execution provider options; a field left out keeps ONNX Runtime's default."""

    device_id: int | None = Field(default=None, ge=0, le=1024, description="The GPU to run on (device_id).")
    cudnn_conv_algo_search: Literal["EXHAUSTIVE", "HEURISTIC", "DEFAULT"] | None = Field(
        default=None, description="How cuDNN picks convolution algorithms (cudnn_conv_algo_search; ORT's default EXHAUSTIVE)."
    )
    enable_cuda_graph: bool | None = Field(
        default=None,
        description=(
            "Capture the model's kernels in a CUDA graph and replay it (enable_cuda_graph). Needs I/O binding and static "
            "input shapes: one graph is captured per input shape."
        ),
    )
    use_tf32: bool | None = Field(default=None, description="Allow TF32 math in MatMul and convolutions on Ampere and newer (use_tf32).")
    do_copy_in_default_stream: bool | None = Field(
        default=None, description="Copy between host and device on the compute stream (do_copy_in_default_stream)."
    )
    cudnn_conv_use_max_workspace: bool | None = Field(
        default=None, description="Let cuDNN convolutions use the largest workspace (cudnn_conv_use_max_workspace)."
    )
    arena_extend_strategy: Literal["kNextPowerOfTwo", "kSameAsRequested"] | None = Field(
        default=None, description="How the CUDA memory arena grows (arena_extend_strategy)."
    )
    gpu_mem_limit: int | None = Field(default=None, ge=1, description="Most bytes the CUDA memory arena may hold (gpu_mem_limit).")
    prefer_nhwc: bool | None = Field(default=None, description="Prefer NHWC layouts for convolutions (prefer_nhwc).")
    use_ep_level_unified_stream: bool | None = Field(
        default=None, description="One CUDA stream for the whole provider (use_ep_level_unified_stream)."
    )

    def to_json(self) -> dict[str, Any]:
        """Only the options set: the defaults are ONNX Runtime's, not part of the fingerprint."""
        return {key: value for key, value in self.model_dump(mode="json").items() if value is not None}


class OpenVinoEpOptions(StrictConfig):
    """OpenVINO execution provider options (onnxruntime-openvino); a field left out keeps its default."""

    device_type: str | None = Field(
        default=None, min_length=1, max_length=64, description="OpenVINO device: CPU, GPU, GPU.0, NPU, AUTO:GPU,CPU, ... (device_type)."
    )
    precision: Literal["FP32", "FP16", "ACCURACY"] | None = Field(
        default=None, description="Inference precision (precision); ACCURACY keeps the model's own precision."
    )
    num_of_threads: int | None = Field(default=None, ge=1, le=1024, description="Inference threads (num_of_threads).")
    num_streams: int | None = Field(default=None, ge=1, le=1024, description="Parallel inference streams, for throughput (num_streams).")
    performance_hint: Literal["LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT"] | None = Field(
        default=None, description="OpenVINO's PERFORMANCE_HINT, passed through load_config as {device: {PERFORMANCE_HINT: ...}}."
    )
    enable_qdq_optimizer: bool | None = Field(
        default=None, description="Optimize QDQ (quantized) graphs for the NPU (enable_qdq_optimizer)."
    )
    disable_dynamic_shapes: bool | None = Field(
        default=None, description="Compile dynamic inputs as static shapes at the first run's shapes (disable_dynamic_shapes)."
    )
    model_priority: Literal["LOW", "MEDIUM", "HIGH", "DEFAULT"] | None = Field(
        default=None, description="Priority of this model among those compiled on the same device (model_priority)."
    )

    def to_json(self) -> dict[str, Any]:
        """Only the options set (see ``CudaOptions.to_json``)."""
        return {key: value for key, value in self.model_dump(mode="json").items() if value is not None}


def _flag(value: bool) -> str:
    return "1" if value else "0"


def cuda_provider_options(options: CudaOptions) -> dict[str, str]:
    """The CUDA EP's provider options for the fields set (ORT takes strings; "1"/"0" for flags)."""
    mapped: dict[str, str] = {}
    for key, value in options.to_json().items():
        mapped[key] = _flag(value) if isinstance(value, bool) else str(value)
    return mapped


def openvino_provider_options(options: OpenVinoEpOptions, existing: dict[str, Any] | None) -> dict[str, str]:
    """The OpenVINO EP's provider options for the fields set. Its flags are "True"/"False";
    ``performance_hint`` goes into ``load_config`` (a JSON string since ORT 1.23) under the device,
    merged with a ``load_config`` the user gave in the raw provider options."""
    mapped: dict[str, str] = {}
    for key, value in options.to_json().items():
        if key == "performance_hint":
            continue
        mapped[key] = str(value) if not isinstance(value, bool) else ("True" if value else "False")
    if options.performance_hint is not None:
        device = (options.device_type or str((existing or {}).get("device_type") or "CPU")).split(".")[0].split(":")[0]
        raw = (existing or {}).get("load_config")
        config: dict[str, Any] = {}
        if isinstance(raw, str) and raw.strip().startswith("{"):
            config = json.loads(raw)
        elif isinstance(raw, dict):
            config = dict(raw)
        section = dict(config.get(device) or {})
        section["PERFORMANCE_HINT"] = options.performance_hint
        config[device] = section
        mapped["load_config"] = json.dumps(config, sort_keys=True)
    return mapped
