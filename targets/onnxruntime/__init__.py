"""The ONNX Runtime target family: one target class, any execution provider.

- ``target``: the target, its config and its session;
- ``eps``: the execution provider catalog (names, aliases, packages, why one is unavailable here),
  plugin EPs (``onnxruntime-ep-*``);
- ``placement``: which EP took which nodes, and the check that refuses a silent fallback;
- ``tensorrt``: TensorRT's typed options and its content-keyed engine / timing cache.

Nothing here imports onnxruntime at module import.
"""

from targets.onnxruntime import eps, placement, tensorrt
from targets.onnxruntime.eps import CPU, CUDA, TENSORRT
from targets.onnxruntime.target import OnnxRuntimeSession, OnnxRuntimeTarget, catalog_report, numpy_dtype_name

__all__ = [
    "CPU",
    "CUDA",
    "TENSORRT",
    "OnnxRuntimeSession",
    "OnnxRuntimeTarget",
    "catalog_report",
    "eps",
    "numpy_dtype_name",
    "placement",
    "tensorrt",
]
