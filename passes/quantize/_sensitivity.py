"""Which quantized nodes cost the most accuracy: the noise each quantized tensor carries, mapped to
the float nodes whose quantization puts it there (used by ``ort_quantize_accuracy``).

A quantized model is a set of *quantization points*: activation tensors wrapped in a
QuantizeLinear/DequantizeLinear pair, and weights stored in 8 bits. Each point's noise is its
signal-to-quantization-noise ratio (SQNR, dB: ``10 log10(sum x^2 / sum (x - q(x))^2)``):

- activations (static QDQ): onnxruntime's QDQ debugging tools (``qdq_loss_debug``) make every
  float tensor of the quantized model an output, and pair each quantized tensor's value before
  its QuantizeLinear with its value after the DequantizeLinear, on a few calibration samples. This
  is the noise that point adds *locally*; comparing with the FP32 model's activations instead
  mixes in all the noise upstream, which points at late layers rather than at the cause;
- weights: the float initializer against its 8-bit copy dequantized (onnxruntime's
  ``create_weight_matching`` subtracts the zero point in uint8 and wraps around, so this module
  dequantizes by itself).

Values of magnitude 1e30 and above (attention masks built from ``finfo.min``) and non-finite ones
are left out of the sums: otherwise one such value outweighs everything else, and the point that
ruins attention (scores + mask quantized with a range of 3.4e38, so every real score becomes 0)
would look perfect.

A point disappears only when *every* node that asks for it is left in float: its quantized
consumers, and its producer unless that is a MatMul / Conv / Gemm (onnxruntime's QDQ quantizers
of those ops quantize their inputs only). Those nodes are the point's ``nodes``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx

#: magnitudes from which a value is a sentinel (masking constant), not a signal
SENTINEL = 1e30
#: op types whose onnxruntime QDQ quantizer quantizes inputs, never the output
_INPUTS_ONLY = frozenset({"MatMul", "Conv", "ConvTranspose", "Gemm"})
#: the suffix onnxruntime's quantizers give the 8-bit copy of an initializer
_QUANTIZED_SUFFIX = "_quantized"
_CONV_OPS = frozenset({"Conv", "ConvInteger", "ConvTranspose", "QLinearConv"})
#: SQNR below -_FLOOR_DB (a signal of zero energy turned into noise) is reported as -_FLOOR_DB: details stay finite
_FLOOR_DB = 300.0


@dataclass(frozen=True)
class Point:
    """A quantized tensor, how much noise its quantization adds, and the nodes that ask for it."""

    tensor: str
    kind: str  # "activation" or "weight"
    sqnr_db: float
    order: int  # position of the first node touching it, for a stable order among equals
    nodes: tuple[str, ...]

    @property
    def noise(self) -> float:
        """Noise power relative to the signal's (1.0 at 0 dB)."""
        return 10 ** (-self.sqnr_db / 10)


class _Ratio:
    """Running signal and noise energies of one point, in float64, sentinels left out."""

    def __init__(self) -> None:
        self.signal = 0.0
        self.noise = 0.0

    def add(self, clean: Any, noisy: Any, bounds: tuple[float, float] | None = None) -> None:
        x = np.asarray(clean, dtype=np.float64).ravel()
        y = np.asarray(noisy, dtype=np.float64).ravel()
        if x.shape != y.shape:
            return
        if bounds is not None:
            x = np.clip(x, *bounds)  # a Relu / Clip the quantizer removed: the output's range does its work
        keep = np.isfinite(x) & np.isfinite(y) & (np.abs(x) < SENTINEL)
        x, diff = x[keep], x[keep] - y[keep]
        self.signal += float(x @ x)
        self.noise += float(diff @ diff)

    def sqnr_db(self) -> float:
        if self.noise <= 0.0:
            return math.inf
        if self.signal <= 0.0:
            return -math.inf
        return 10 * math.log10(self.signal / self.noise)


def name_nodes(model: onnx.ModelProto) -> int:
    """Name every unnamed node of ``model``'s main graph ``<op_type>_<index>`` (a node is excluded
    from quantization by name); return how many were named."""
    taken = {node.name for node in model.graph.node if node.name}
    named = 0
    for index, node in enumerate(model.graph.node):
        if node.name:
            continue
        name = f"{node.op_type}_{index}"
        while name in taken:
            name += "_"
        node.name = name
        taken.add(name)
        named += 1
    return named


def activation_bounds(model: onnx.ModelProto) -> dict[str, tuple[float, float]]:
    """The output range of every Relu and constant-bounded Clip: onnxruntime drops such a node after
    a quantized op and lets the output's quantization clip, so the value before QuantizeLinear is
    then the unclipped one, and only its clipped version is the signal."""
    from onnx import numpy_helper

    constants = {t.name: t for t in model.graph.initializer}

    def constant(name: str, default: float) -> float | None:
        if not name:
            return default
        tensor = constants.get(name)
        return None if tensor is None else float(numpy_helper.to_array(tensor))

    bounds: dict[str, tuple[float, float]] = {}
    for node in model.graph.node:
        if node.op_type == "Relu":
            bounds[node.output[0]] = (0.0, math.inf)
        elif node.op_type == "Clip":
            attributes = {a.name: a.f for a in node.attribute}
            low = attributes.get("min", constant(node.input[1], -math.inf) if len(node.input) > 1 else -math.inf)
            high = attributes.get("max", constant(node.input[2], math.inf) if len(node.input) > 2 else math.inf)
            if low is not None and high is not None:
                bounds[node.output[0]] = (low, high)
    return bounds


def activation_noise(
    quantized_file: Path,
    batches: list[dict[str, np.ndarray]],
    workdir: Path,
    bounds: dict[str, tuple[float, float]],
) -> dict[str, float]:
    """SQNR (dB) of every quantized activation of a QDQ model, by the float tensor's name."""
    import onnxruntime
    from onnxruntime.quantization.qdq_loss_debug import (
        collect_activations,
        create_activation_matching,
        modify_model_output_intermediate_tensors,
    )

    from passes.quantize.calibration import BatchReader

    augmented = workdir / "sensitivity_augmented.onnx"
    modify_model_output_intermediate_tensors(str(quantized_file), str(augmented))
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1  # the same sums, bit for bit, on any machine
    options.log_severity_level = 3
    ratios: dict[str, _Ratio] = {}
    try:
        for batch in batches:  # one sample at a time: only one sample's activations in memory
            activations = collect_activations(str(augmented), BatchReader([batch]), session_options=options)
            for name, pair in create_activation_matching(activations).items():
                ratio = ratios.setdefault(name, _Ratio())
                for pre, post in zip(pair["pre_qdq"], pair["post_qdq"], strict=True):
                    ratio.add(pre, post, bounds.get(name))
    finally:
        augmented.unlink(missing_ok=True)
    return {name: ratio.sqnr_db() for name, ratio in ratios.items()}


def weight_noise(float_model: onnx.ModelProto, quantized_model: onnx.ModelProto) -> dict[str, float]:
    """SQNR (dB) of every initializer the quantized model holds in 8 bits (``<name>_quantized`` with
    ``<name>_scale`` and ``<name>_zero_point``), by the float initializer's name; QDQ and dynamic alike."""
    from onnx import numpy_helper

    floats = {t.name: t for t in float_model.graph.initializer}
    stored = {t.name: t for t in quantized_model.graph.initializer}
    axes: dict[str, int] = {}
    conv_inputs: set[str] = set()
    for node in quantized_model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input:
            axes[node.input[0]] = next((a.i for a in node.attribute if a.name == "axis"), 1)
        if node.op_type in _CONV_OPS:
            conv_inputs.update(node.input)
    noise: dict[str, float] = {}
    for name, tensor in stored.items():
        base = name[: -len(_QUANTIZED_SUFFIX)]
        scale_t, zero_t = stored.get(f"{base}_scale"), stored.get(f"{base}_zero_point")
        if not name.endswith(_QUANTIZED_SUFFIX) or base not in floats or scale_t is None:
            continue
        quantized = numpy_helper.to_array(tensor).astype(np.float64)
        scale = numpy_helper.to_array(scale_t).astype(np.float64)
        zero = numpy_helper.to_array(zero_t).astype(np.float64) if zero_t is not None else np.zeros_like(scale)
        if scale.size > 1:
            axis = axes.get(name, 0 if name in conv_inputs else quantized.ndim - 1)
            axis = axis % max(quantized.ndim, 1)
            if quantized.ndim == 0 or quantized.shape[axis] != scale.size:
                continue  # a layout this module does not know: better no figure than a wrong one
            shape = [1] * quantized.ndim
            shape[axis] = scale.size
            scale, zero = scale.reshape(shape), zero.reshape(shape)
        ratio = _Ratio()
        ratio.add(numpy_helper.to_array(floats[base]), (quantized - zero) * scale)
        noise[base] = ratio.sqnr_db()
    return noise


def points(float_model: onnx.ModelProto, activations: dict[str, float], weights: dict[str, float], candidates: set[str]) -> list[Point]:
    """The quantization points worst first (lowest SQNR; then graph order, then name), each with
    the ``candidates`` (nodes that may be quantized) that ask for it. Lossless points (a Reshape's
    output sharing its input's scale) and points no candidate asks for are left out."""
    producers: dict[str, tuple[int, onnx.NodeProto]] = {}
    consumers: dict[str, list[tuple[int, onnx.NodeProto]]] = {}
    for index, node in enumerate(float_model.graph.node):
        for output in node.output:
            producers[output] = (index, node)
        for name in dict.fromkeys(node.input):
            consumers.setdefault(name, []).append((index, node))
    found: list[Point] = []
    for kind, noise in (("activation", activations), ("weight", weights)):
        for tensor, sqnr in noise.items():
            if math.isinf(sqnr) and sqnr > 0:
                continue
            users = consumers.get(tensor, [])
            nodes = [node.name for _, node in users if node.name in candidates]
            order = min((index for index, _ in users), default=len(float_model.graph.node))
            if kind == "activation" and tensor in producers:
                order, producer = producers[tensor]
                if producer.name in candidates and producer.op_type not in _INPUTS_ONLY:
                    nodes.insert(0, producer.name)
            if nodes:
                found.append(Point(tensor, kind, round(max(sqnr, -_FLOOR_DB), 3), order, tuple(dict.fromkeys(nodes))))
    found.sort(key=lambda p: (p.sqnr_db, p.order, p.tensor))
    return found


def next_nodes(ranked: Iterable[Point], excluded: set[str], count: int) -> list[str]:
    """The nodes of the worst points not yet excluded, whole points at a time, until at least
    ``count`` nodes are new (a point half left in float is still quantized)."""
    chosen: list[str] = []
    for point in ranked:
        new = [n for n in point.nodes if n not in excluded and n not in chosen]
        chosen.extend(new)
        if len(chosen) >= count:
            break
    return chosen


def op_type_ranking(ranked: Iterable[Point], op_types: dict[str, str]) -> list[tuple[str, float]]:
    """Op types by the summed relative noise power of the points their nodes ask for, largest first
    (a point asked for by two op types counts for both)."""
    totals: dict[str, float] = {}
    for point in ranked:
        for op_type in dict.fromkeys(op_types[n] for n in point.nodes):
            totals[op_type] = totals.get(op_type, 0.0) + point.noise
    return sorted(((op, round(total, 6)) for op, total in totals.items()), key=lambda item: (-item[1], item[0]))


def describe(ranked: list[Point], seconds: float, samples: int, top: int = 12) -> dict[str, Any]:
    """What the details show of a sensitivity measurement: the worst points and the totals."""
    return {
        "points": len(ranked),
        "activation_points": sum(1 for p in ranked if p.kind == "activation"),
        "weight_points": sum(1 for p in ranked if p.kind == "weight"),
        "samples": samples,
        "seconds": round(seconds, 3),
        "worst": [{"tensor": p.tensor, "kind": p.kind, "sqnr_db": p.sqnr_db, "nodes": list(p.nodes)} for p in ranked[:top]],
    }


def measure(
    float_file: Path,
    quantized_file: Path,
    batches: list[dict[str, np.ndarray]] | None,
    candidates: set[str],
    workdir: Path,
) -> tuple[list[Point], float]:
    """The ranked points of ``quantized_file`` (activations only when ``batches`` are given: a QDQ
    model) and the seconds it took."""
    import onnx

    started = time.perf_counter()
    float_model = onnx.load(str(float_file))
    activations = activation_noise(quantized_file, batches, workdir, activation_bounds(float_model)) if batches else {}
    weights = weight_noise(float_model, onnx.load(str(quantized_file)))
    return points(float_model, activations, weights, candidates), time.perf_counter() - started
