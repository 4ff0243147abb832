"""The execution providers Kiln knows: names, aliases, device kinds, packages, and host checks.

Each entry says which wheel provides the EP and, through ``host_problem``, precisely why the EP
cannot run here (wrong OS, no driver, a library that does not load). ``availability_of`` adds
whether this onnxruntime build has the EP at all. Plugin EPs (``onnxruntime-ep-*`` packages)
are found with importlib.metadata and registered with onnxruntime on first use.

onnxruntime is imported only inside functions (see the package docstring).
"""

from __future__ import annotations

import ctypes
import difflib
import functools
import importlib
import platform
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
OPENVINO = "OpenVINOExecutionProvider"
SUFFIX = "ExecutionProvider"

#: the shared libraries TensorRT's EP needs, newest major version first
_NVINFER = ("libnvinfer.so.10", "libnvinfer.so.8", "libnvinfer.so")


def _system() -> str:
    return platform.system()


def nvidia_problem() -> str | None:
    """Why no NVIDIA GPU can be used here, or None when a driver is present."""
    if _system() == "Windows":
        return None if shutil.which("nvidia-smi") else "no NVIDIA driver here (nvidia-smi not found)"
    smi = shutil.which("nvidia-smi")
    proc = Path("/proc/driver/nvidia").exists()
    if smi or proc:
        return None
    return "no NVIDIA GPU or driver here (nvidia-smi not found and /proc/driver/nvidia missing)"


def _loads(names: tuple[str, ...]) -> bool:
    """Whether one of the shared libraries ``names`` loads here."""
    for name in names:
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return True
    return False


def _tensorrt_problem() -> str | None:
    gpu = nvidia_problem()
    if gpu or _loads(_NVINFER):
        return gpu
    return (
        f"TensorRT's library is not loadable (tried {', '.join(_NVINFER)}): install TensorRT "
        "(pip install tensorrt, or NVIDIA's packages) and put its lib folder on LD_LIBRARY_PATH"
    )


def _only_on(system: str, label: str) -> Callable[[], str | None]:
    def check() -> str | None:
        here = _system()
        return None if here == system else f"runs on {label} only (this host is {here or 'unknown'})"

    return check


def _android_problem() -> str | None:
    # Python's platform reports Linux on Android; Android has /system/build.prop
    if Path("/system/build.prop").exists():
        return None
    return f"runs on Android only (this host is {_system()})"


def _qnn_problem() -> str | None:
    machine = platform.machine().lower()
    if machine in ("arm64", "aarch64"):
        return None
    return f"needs a Qualcomm Snapdragon SoC with its Hexagon NPU (this host is {machine or 'unknown'})"


def _windows_ryzen_ai_problem() -> str | None:
    here = _system()
    if here != "Windows":
        return f"needs an AMD Ryzen AI NPU with the Ryzen AI software, on Windows (this host is {here or 'unknown'})"
    return None


def _amd_gpu_problem() -> str | None:
    if Path("/dev/kfd").exists() or (_system() == "Windows" and shutil.which("hipinfo")):
        return None
    return "no AMD GPU with ROCm here (/dev/kfd missing): needs an AMD Instinct or Radeon GPU and ROCm"


#: TensorRT for RTX's shared library (the NvTensorRTRTX EP links it), newest first
_TENSORRT_RTX = ("libtensorrt_rtx.so.1", "libtensorrt_rtx.so", "tensorrt_rtx_1_2.dll", "tensorrt_rtx_1_1.dll", "tensorrt_rtx_1_0.dll")


def _rtx_problem() -> str | None:
    gpu = nvidia_problem()
    if gpu or _loads(_TENSORRT_RTX):
        return gpu
    return f"TensorRT for RTX's library is not loadable (tried {', '.join(_TENSORRT_RTX)}): install TensorRT for RTX and put it on the library path"


def _arm_problem() -> str | None:
    machine = platform.machine().lower()
    return None if machine in ("arm64", "aarch64") else f"runs on Arm CPUs only (this host is {machine or 'unknown'})"


def _no_problem() -> str | None:
    return None


@dataclass(frozen=True)
class EpInfo:
    name: str
    alias: str
    device: str  # the kind of device it runs on: cpu, gpu, npu, remote
    package: str
    install: str
    host_problem: Callable[[], str | None] = _no_problem


CATALOG: tuple[EpInfo, ...] = (
    EpInfo(CPU, "cpu", "cpu", "onnxruntime", "pip install onnxruntime"),
    EpInfo(CUDA, "cuda", "gpu", "onnxruntime-gpu", "pip install onnxruntime-gpu (in place of onnxruntime)", nvidia_problem),
    EpInfo(TENSORRT, "tensorrt", "gpu", "onnxruntime-gpu", "pip install onnxruntime-gpu tensorrt", _tensorrt_problem),
    EpInfo(
        OPENVINO,
        "openvino",
        "cpu",
        "onnxruntime-ep-openvino",
        (
            "pip install onnxruntime-ep-openvino (a plugin EP for Intel devices), or declare the onnxruntime-openvino wheel "
            "in an isolated `environment:` (it replaces the onnxruntime module, so it cannot live beside it); "
            "for native OpenVINO use the `openvino` runtime"
        ),
    ),
    EpInfo(
        "DmlExecutionProvider", "dml", "gpu", "onnxruntime-directml", "pip install onnxruntime-directml", _only_on("Windows", "Windows")
    ),
    EpInfo("CoreMLExecutionProvider", "coreml", "npu", "onnxruntime", "pip install onnxruntime (macOS wheel)", _only_on("Darwin", "macOS")),
    EpInfo("QNNExecutionProvider", "qnn", "npu", "onnxruntime-qnn", "pip install onnxruntime-qnn", _qnn_problem),
    EpInfo("NnapiExecutionProvider", "nnapi", "npu", "onnxruntime-android", "an onnxruntime Android build (AAR)", _android_problem),
    EpInfo(
        "WebGpuExecutionProvider",
        "webgpu",
        "gpu",
        "onnxruntime-ep-webgpu",
        "pip install onnxruntime-ep-webgpu (a plugin EP), or an onnxruntime build with --use_webgpu",
    ),
    EpInfo("AzureExecutionProvider", "azure", "remote", "onnxruntime", "pip install onnxruntime"),
    EpInfo(
        "NvTensorRTRTXExecutionProvider",
        "tensorrt_rtx",
        "gpu",
        "onnxruntime-ep-nv-tensorrt-rtx",
        "pip install onnxruntime-ep-nv-tensorrt-rtx-cu13 (or -cu12: a plugin EP for NVIDIA RTX GPUs, with TensorRT for RTX)",
        _rtx_problem,
    ),
    EpInfo(
        "MIGraphXExecutionProvider",
        "migraphx",
        "gpu",
        "onnxruntime-migraphx",
        "pip install onnxruntime-migraphx (or the plugin EP onnxruntime-ep-migraphx) on a host with ROCm",
        _amd_gpu_problem,
    ),
    EpInfo(
        "ROCMExecutionProvider",
        "rocm",
        "gpu",
        "onnxruntime-rocm",
        "pip install onnxruntime-rocm (AMD's ROCm wheel index) on a host with ROCm",
        _amd_gpu_problem,
    ),
    EpInfo(
        "VitisAIExecutionProvider",
        "vitisai",
        "npu",
        "onnxruntime-vitisai",
        "AMD's Ryzen AI software (its onnxruntime-vitisai wheel), on Windows with a Ryzen AI NPU",
        _windows_ryzen_ai_problem,
    ),
    EpInfo("XnnpackExecutionProvider", "xnnpack", "cpu", "onnxruntime (mobile and Arm builds)", "an onnxruntime build with --use_xnnpack"),
    EpInfo("DnnlExecutionProvider", "dnnl", "cpu", "onnxruntime (oneDNN build)", "an onnxruntime build with --use_dnnl"),
    EpInfo(
        "ACLExecutionProvider", "acl", "cpu", "onnxruntime (Arm Compute Library build)", "an onnxruntime build with --use_acl", _arm_problem
    ),
    EpInfo("CANNExecutionProvider", "cann", "npu", "onnxruntime-cann", "pip install onnxruntime-cann on a host with a Huawei Ascend NPU"),
    EpInfo("WebNNExecutionProvider", "webnn", "gpu", "onnxruntime-web", "onnxruntime-web in a browser with WebNN"),
)

_BY_NAME = {ep.name: ep for ep in CATALOG}
_BY_ALIAS = {ep.alias: ep for ep in CATALOG}
#: words users write for an EP that are not its alias: suggested, not accepted
_OTHER_WORDS = {
    "trt": TENSORRT,
    "ov": OPENVINO,
    "directml": "DmlExecutionProvider",
    "gpu": CUDA,
    "trt_rtx": "NvTensorRTRTXExecutionProvider",
    "nvtensorrtrtx": "NvTensorRTRTXExecutionProvider",
    "ryzenai": "VitisAIExecutionProvider",
}


def lookup(name: str) -> EpInfo | None:
    return _BY_NAME.get(name) or _BY_ALIAS.get(name)


def normalize(name: str) -> str:
    """An alias or full name → the full name. A name not in the catalog that ends in
    ``ExecutionProvider`` is a plugin EP declared by name and is kept; a near miss of a known
    name (``CudaExecutionProvider``, ``tensorrt_ep``) or any other word is an error that says
    what was probably meant."""
    known = lookup(name)
    if known:
        return known.name
    stem = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name
    stems = {ep.name[: -len(SUFFIX)].lower(): ep for ep in CATALOG}
    words = {**stems, **_BY_ALIAS, **{word: _BY_NAME[full] for word, full in _OTHER_WORDS.items()}}
    close = difflib.get_close_matches(stem.lower(), list(words), n=1, cutoff=0.75)
    if close:
        ep = words[close[0]]
        raise ValueError(f"unknown execution provider '{name}': did you mean '{ep.name}' (alias '{ep.alias}')?")
    if name.endswith(SUFFIX) and len(stem) > 0:
        return name  # a plugin EP, declared by its full name
    names = ", ".join(ep.alias for ep in CATALOG)
    raise ValueError(f"unknown execution provider '{name}': use a full name (…ExecutionProvider) or an alias ({names})")


# -- plugin EPs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PluginEp:
    distribution: str
    version: str
    module: str


@functools.lru_cache(maxsize=1)
def _scan_distributions() -> tuple[PluginEp, ...]:
    found: dict[str, PluginEp] = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if not name.startswith("onnxruntime-ep-") or name in found:
            continue
        top = (dist.read_text("top_level.txt") or "").split()
        found[name] = PluginEp(name, dist.version, top[0] if top else name.replace("-", "_"))
    return tuple(sorted(found.values(), key=lambda plugin: plugin.distribution))


def plugin_distributions() -> list[PluginEp]:
    """Installed ``onnxruntime-ep-*`` distributions (each exposes ``get_library_path()`` and
    ``get_ep_names()`` in its top-level module); scanned once per process."""
    return list(_scan_distributions())


_registered: dict[str, str] = {}  # EP name → distribution, for this process


def register_plugins(onnxruntime: Any) -> dict[str, str]:
    """Register every installed plugin EP library with onnxruntime once; EP name → distribution.
    A plugin that fails to import or register is left out (``plugin_problem`` says why)."""
    if not hasattr(onnxruntime, "register_execution_provider_library"):
        return {}
    for plugin in plugin_distributions():
        if plugin.distribution in _registered.values():
            continue
        try:
            module = importlib.import_module(plugin.module)
            names = list(module.get_ep_names()) if hasattr(module, "get_ep_names") else [module.get_ep_name()]
            library = module.get_library_path()
            for ep_name in names:
                onnxruntime.register_execution_provider_library(ep_name, library)
                _registered[ep_name] = plugin.distribution
        except Exception:  # noqa: BLE001 - a broken plugin is reported by plugin_problem, not fatal
            continue
    return dict(_registered)


def plugin_devices(onnxruntime: Any, ep_name: str) -> list[Any]:
    """The ``OrtEpDevice`` entries onnxruntime offers for ``ep_name`` on this host."""
    if not hasattr(onnxruntime, "get_ep_devices"):
        return []
    return [device for device in onnxruntime.get_ep_devices() if device.ep_name == ep_name]


def _plugin_state(onnxruntime: Any, name: str) -> tuple[bool, str | None]:
    """(is a plugin EP here, problem) for an EP onnxruntime's build does not list."""
    registered = register_plugins(onnxruntime)
    if name not in registered:
        return False, None
    devices = plugin_devices(onnxruntime, name)
    if devices:
        return True, None
    dist = registered[name]
    version = next((p.version for p in plugin_distributions() if p.distribution == dist), "?")
    hint = ""
    if name == OPENVINO:  # the plugin's devices are Intel CPUs, GPUs and NPUs
        hint = "; OpenVINO's plugin offers Intel devices only: use the onnxruntime-openvino wheel in an isolated `environment:`, or the `openvino` runtime"
    return (
        True,
        f"the plugin EP from {dist} {version} registered but offers no device on this host (get_ep_devices lists none for it){hint}",
    )


def availability_of(onnxruntime: Any, name: str) -> str | None:
    """Why the EP ``name`` cannot run here with this onnxruntime, or None when it can."""
    info = _BY_NAME.get(name)
    problems: list[str] = []
    in_build = name in onnxruntime.get_available_providers()
    if not in_build:
        plugin, problem = _plugin_state(onnxruntime, name)
        if plugin:
            return problem
        where = f"not in this onnxruntime build ({onnxruntime.__version__})"
        problems.append(
            f"{where}; it comes with {info.package}: {info.install}"
            if info
            else f"{where} and no installed onnxruntime-ep-* package provides it"
        )
    if info is not None:
        host = info.host_problem()
        if host:
            problems.append(host)
    return "; ".join(problems) or None


def is_plugin(onnxruntime: Any, name: str) -> bool:
    return name not in onnxruntime.get_available_providers() and name in register_plugins(onnxruntime)
