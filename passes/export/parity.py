"""Compare an exported model under onnxruntime with the torch module it came from.

Imported by ``torch_export`` only when the pass runs: torch and onnxruntime are heavy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class Case:
    """One set of inputs and the torch module's outputs on them."""

    inputs: dict[str, torch.Tensor]
    outputs: list[np.ndarray]

    def shapes(self) -> dict[str, list[int]]:
        return {name: list(tensor.shape) for name, tensor in self.inputs.items()}


def torch_case(module: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> Case:
    """Run ``module(*inputs.values())`` in eval mode without gradients."""
    module.eval()
    with torch.no_grad():
        outputs = module(*inputs.values())
    return Case(inputs=inputs, outputs=[output.detach().cpu().numpy() for output in outputs])


def max_abs_diff(expected: np.ndarray, actual: np.ndarray) -> float:
    """Largest absolute difference; NaN in both at the same place counts as equal, elsewhere as inf."""
    if expected.shape != actual.shape:
        return float("inf")
    expected, actual = expected.astype(np.float64), actual.astype(np.float64)
    same = (expected == actual) | (np.isnan(expected) & np.isnan(actual))
    diff = np.where(same, 0.0, np.abs(expected - actual))
    diff = np.where(np.isnan(diff), np.inf, diff)
    return float(diff.max()) if diff.size else 0.0


def check(path: Path, output_names: list[str], cases: list[Case], tolerance: float, providers: list[str] | None = None) -> dict[str, Any]:
    """Run ``path`` in onnxruntime on every case; raise ValueError if any output is off by more
    than ``tolerance``; return the figures. ``providers``: onnxruntime's execution providers (default CPU).
    An export checks its parity on the CPU whatever the target: the CPU is the reference a GPU's
    kernels are measured against, and the export is one model shared by every target."""
    import onnxruntime  # heavy: imported only when parity is checked

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: a pass never prints
    session = onnxruntime.InferenceSession(str(path), options, providers=providers or ["CPUExecutionProvider"])
    feeds_wanted = [i.name for i in session.get_inputs()]
    worst = dict.fromkeys(output_names, 0.0)
    where: dict[str, dict[str, list[int]]] = {}
    for case in cases:
        feeds = {name: case.inputs[name].numpy() for name in feeds_wanted}
        results = session.run(output_names, feeds)
        for name, expected, actual in zip(output_names, case.outputs, results, strict=True):
            if expected.shape != actual.shape:
                raise ValueError(
                    f"output {name} has shape {list(actual.shape)} in onnxruntime but {list(expected.shape)} in torch (inputs {case.shapes()})"
                )
            diff = max_abs_diff(expected, actual)
            if name not in where or diff > worst[name]:
                worst[name], where[name] = diff, case.shapes()
    overall = max(worst.values())
    if overall > tolerance:
        name = max(worst, key=lambda key: worst[key])
        raise ValueError(
            f"onnxruntime and torch differ by up to {overall:.3g} on output {name} (inputs {where[name]}), above parity_tolerance {tolerance:g}"
        )
    return {
        "max_abs_diff": overall,
        "tolerance": tolerance,
        "outputs": [{"name": name, "max_abs_diff": worst[name]} for name in output_names],
        "cases": [case.shapes() for case in cases],
    }
