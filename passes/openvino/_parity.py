"""Output parity of a written IR with the model it came from, at FP32 (``f32`` precision hint).

The same random feeds (made from the IR's inputs, at two batch / sequence sizes where the axes
are dynamic) go through the source (onnxruntime for ONNX, torch for PyTorch / Hugging Face,
OpenVINO itself for IR) and through the IR; the largest absolute difference per output is
recorded, and the pass fails above its tolerance.

Imported by the passes only when they run: it imports numpy and openvino.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from engine.core.data import synthetic_feeds
from engine.core.target import TensorSpec
from targets.openvino import dtype_name, port_name, port_shape

#: (batch, sequence) of the parity feeds; static dims keep their size
SIZES = ((2, 16), (1, 9))

Runner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


def specs(ports: Any, kind: str) -> list[TensorSpec]:
    return [TensorSpec(port_name(p, i, kind), dtype_name(p.get_element_type()), port_shape(p)) for i, p in enumerate(ports)]


def parity_feeds(inputs: list[TensorSpec], int_high: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    cases, seen = [], set()
    for batch, sequence in SIZES:
        feeds = synthetic_feeds(inputs, batch, sequence, seed=seed, int_high=int_high)
        shapes = tuple(array.shape for array in feeds.values())
        if shapes not in seen:
            seen.add(shapes)
            cases.append(feeds)
    return cases


def max_abs_diff(expected: np.ndarray, actual: np.ndarray) -> float:
    expected, actual = np.asarray(expected, np.float64), np.asarray(actual, np.float64)
    if expected.shape != actual.shape:
        return float("inf")
    same = (expected == actual) | (np.isnan(expected) & np.isnan(actual))
    diff = np.where(same, 0.0, np.abs(expected - actual))
    return float(np.nan_to_num(diff, nan=np.inf).max()) if diff.size else 0.0


def ir_runner(xml: Path) -> tuple[Runner, list[TensorSpec], list[TensorSpec]]:
    """Run ``xml`` on CPU at f32; also its input and output specs."""
    compiled = ov.Core().compile_model(str(xml), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        results = request.infer(feeds, share_outputs=False)
        return [results[port] for port in compiled.outputs]

    return run, specs(compiled.inputs, "input"), specs(compiled.outputs, "output")


def onnx_runner(path: Path, output_names: list[str], providers: list[str] | None = None) -> Runner:
    """Run ``path`` in onnxruntime with ``providers`` (default CPU)."""
    import onnxruntime  # heavy: only ONNX parity needs it

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: a pass never prints
    session = onnxruntime.InferenceSession(str(path), options, providers=providers or ["CPUExecutionProvider"])
    wanted = [i.name for i in session.get_inputs()]

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(session.run(output_names, {name: feeds[name] for name in wanted}))

    return run


def torch_runner(module: Any, input_names: list[str]) -> Runner:
    import torch  # already loaded: the model came from torch

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            outputs = module(*(torch.from_numpy(np.ascontiguousarray(feeds[name])) for name in input_names))
        return [output.detach().cpu().numpy() for output in outputs]

    return run


def check(source: Runner, source_name: str, xml: Path, tolerance: float, int_high: int) -> dict[str, Any]:
    """Compare ``xml`` at f32 with ``source`` on random feeds; raise ValueError above ``tolerance``."""
    candidate, inputs, outputs = ir_runner(xml)
    names = [spec.name for spec in outputs]
    worst = dict.fromkeys(names, 0.0)
    where: dict[str, list[list[int]]] = {}
    cases = parity_feeds(inputs, int_high)
    for feeds in cases:
        shapes = [list(array.shape) for array in feeds.values()]
        try:
            expected = source(feeds)
        except Exception as error:
            raise ValueError(
                f"{source_name} failed on the parity feeds (shapes {shapes}; integer inputs drawn from [0, {int_high}), see parity_int_high): "
                f"{type(error).__name__}: {error}"
            ) from error
        actual = candidate(feeds)
        for name, want, got in zip(names, expected, actual, strict=True):
            diff = max_abs_diff(want, got)
            if name not in where or diff > worst[name]:
                worst[name], where[name] = diff, shapes
    overall = max(worst.values()) if worst else 0.0
    if overall > tolerance:
        name = max(worst, key=lambda key: worst[key])
        raise ValueError(
            f"OpenVINO (f32) and {source_name} differ by up to {overall:.3g} on output {name} (input shapes {where[name]}), "
            f"above parity_tolerance {tolerance:g}"
        )
    return {
        "against": source_name,
        "precision_hint": "f32",
        "max_abs_diff": overall,
        "tolerance": tolerance,
        "outputs": [{"name": name, "max_abs_diff": worst[name]} for name in names],
        "cases": [{name: list(array.shape) for name, array in feeds.items()} for feeds in cases],
    }
