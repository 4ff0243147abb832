"""The ONNX Runtime target family: one target class, any execution provider.

- ``target``: the target, its config and its session;
- ``eps``: the execution provider catalog (names, aliases, packages, why one is unavailable here),
  plugin EPs (``onnxruntime-ep-*``);
- ``placement``: which EP took which nodes, and the check that refuses a silent fallback;
- ``tensorrt``: TensorRT's typed options and its content-keyed engine / timing cache;
- ``provider_groups``: the typed CUDA and OpenVINO EP option groups;
- ``binding``: I/O binding (inputs and outputs kept on the session's device, CUDA graphs).

Nothing here imports onnxruntime at module import.
"""

from targets.onnxruntime import binding, eps, placement, provider_groups, tensorrt
from targets.onnxruntime.eps import CPU, CUDA, TENSORRT
from targets.onnxruntime.target import OnnxRuntimeSession, OnnxRuntimeTarget, catalog_report, numpy_dtype_name

__all__ = [
    "CPU",
    "CUDA",
    "TENSORRT",
    "OnnxRuntimeSession",
    "OnnxRuntimeTarget",
    "binding",
    "catalog_report",
    "eps",
    "numpy_dtype_name",
    "placement",
    "provider_groups",
    "tensorrt",
]
