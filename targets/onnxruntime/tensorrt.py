"""TensorRT options, and the store folder that keeps its engine and timing caches.

A TensorRT engine is compiled for one model, one set of builder flags and one GPU; reusing it on
another GPU or with other flags gives wrong timings or fails. The cache folder is therefore named
by the sha256 of all of them (plus the TensorRT and onnxruntime versions), so a compiled engine
is reused exactly when it applies and never mixed between GPUs.
"""

from __future__ import annotations

import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import Field

from engine.core.config import StrictConfig
from engine.core.hashing import sha256_json

_GPU_QUERY = ("nvidia-smi", "--query-gpu=name,compute_cap,driver_version,uuid", "--format=csv,noheader")


class TensorRTOptions(StrictConfig):
    """Typed TensorRT execution provider options (mapped to its ``trt_*`` provider options)."""

    fp16: bool = Field(default=False, description="Let TensorRT build FP16 kernels (trt_fp16_enable).")
    int8: bool = Field(
        default=False,
        description="Let TensorRT build INT8 kernels (trt_int8_enable); needs a quantized (QDQ) model or a calibration table.",
    )
    engine_cache: bool = Field(
        default=True, description="Keep compiled engines in the store, keyed by model, options and GPU (trt_engine_cache_enable)."
    )
    timing_cache: bool = Field(default=True, description="Keep TensorRT's kernel timing cache in the store (trt_timing_cache_enable).")
    builder_optimization_level: int | None = Field(
        default=None,
        ge=0,
        le=5,
        description="TensorRT's builder optimization level (trt_builder_optimization_level); omit for its default (3).",
    )
    max_workspace_mb: int | None = Field(
        default=None, ge=1, description="Workspace TensorRT may use while building, in MiB (trt_max_workspace_size)."
    )
    cuda_graph: bool = Field(
        default=False,
        description=(
            "Capture the TensorRT engine's launches in a CUDA graph and replay it (trt_cuda_graph_enable). Needs I/O binding "
            "and static input shapes: one graph is captured per input shape."
        ),
    )

    def to_json(self) -> dict[str, Any]:
        """As StrictConfig's; ``cuda_graph`` (added later) appears only when on, so the keys of
        targets written before it existed stay the same."""
        data = super().to_json()
        if not data.get("cuda_graph"):
            data.pop("cuda_graph", None)
        return data


def gpu_identity(device_id: int = 0) -> dict[str, str]:
    """Name, compute capability, driver and uuid of GPU ``device_id`` (empty when nvidia-smi is
    absent or fails: no cache folder is then shared with any real GPU's)."""
    if shutil.which(_GPU_QUERY[0]) is None:
        return {}
    try:
        result = subprocess.run([*_GPU_QUERY, f"--id={device_id}"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return {}
    fields = [part.strip() for part in result.stdout.strip().splitlines()[0].split(",")] if result.stdout.strip() else []
    if len(fields) < 4:
        return {}
    return dict(zip(("name", "compute_cap", "driver", "uuid"), fields[:4], strict=True))


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def runtime_versions(onnxruntime_version: str) -> dict[str, str | None]:
    tensorrt = _version("tensorrt") or _version("tensorrt-cu12") or _version("tensorrt-cu13") or _version("tensorrt_libs")
    return {"onnxruntime": onnxruntime_version, "tensorrt": tensorrt}


def cache_key(model_digest: str, options: TensorRTOptions, gpu: dict[str, str], versions: dict[str, str | None]) -> str:
    """The name of the cache folder: sha256 of the model, the options, the GPU and the versions."""
    return sha256_json({"model": model_digest, "tensorrt": options.to_json(), "gpu": gpu, "versions": versions})


def cache_folder(cache_dir: Path, key: str) -> Path:
    return cache_dir / "tensorrt" / key


def provider_options(options: TensorRTOptions, folder: Path | None) -> dict[str, str]:
    """The ``trt_*`` provider options; cache paths only when there is a folder to keep them."""
    mapped = {"trt_fp16_enable": str(options.fp16), "trt_int8_enable": str(options.int8)}
    if options.builder_optimization_level is not None:
        mapped["trt_builder_optimization_level"] = str(options.builder_optimization_level)
    if options.max_workspace_mb is not None:
        mapped["trt_max_workspace_size"] = str(options.max_workspace_mb * 1024 * 1024)
    if options.cuda_graph:
        mapped["trt_cuda_graph_enable"] = "True"
    if folder is not None and options.engine_cache:
        mapped["trt_engine_cache_enable"] = "True"
        mapped["trt_engine_cache_path"] = str(folder / "engines")
    if folder is not None and options.timing_cache:
        mapped["trt_timing_cache_enable"] = "True"
        mapped["trt_timing_cache_path"] = str(folder / "timing")
    return mapped


def prepare_folder(
    cache_dir: Path | None, model_digest: str, options: TensorRTOptions, onnxruntime_version: str, device_id: int
) -> Path | None:
    """The content-keyed cache folder for this model and GPU, created; None without a cache dir
    or when neither cache is wanted."""
    if cache_dir is None or not (options.engine_cache or options.timing_cache):
        return None
    key = cache_key(model_digest, options, gpu_identity(device_id), runtime_versions(onnxruntime_version))
    folder = cache_folder(cache_dir, key)
    (folder / "engines").mkdir(parents=True, exist_ok=True)
    (folder / "timing").mkdir(parents=True, exist_ok=True)
    return folder


def options_with(existing: dict[str, Any] | None, mapped: dict[str, str]) -> dict[str, Any]:
    """``mapped`` merged over the user's provider options for TensorRT (typed options win)."""
    return {**(existing or {}), **mapped}
