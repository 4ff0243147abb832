"""What the NNCF passes share when they run: the input as an ``ov.Model``, calibration data as an
``nncf.Dataset``, NNCF's enums from config strings, and the figures every pass reports.

ONNX inputs are read into OpenVINO in memory (``Core.read_model``) and quantized with NNCF's
OpenVINO backend, so every NNCF pass produces OpenVINO IR; NNCF's ONNX backend (ONNX in, QDQ ONNX
out) is not used.

Imported by the passes only when they run: it imports numpy, openvino and nncf.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nncf
import numpy as np
import openvino as ov

from engine.core import KilnError, ModelArtifact, PassContext
from passes.openvino import _ir
from targets.openvino import dtype_name, port_name, port_shape

if TYPE_CHECKING:
    from passes.openvino._base import QuantizeOptions


@dataclass
class Input:
    model: ov.Model
    hint: str | None
    facts: dict[str, Any]


def read(model: ModelArtifact) -> Input:
    ov_model = _ir.read_input(model)
    facts = {
        "source_format": model.format,
        "node_count": len(ov_model.get_ops()),
        "weight_bytes": _ir.weight_bytes(ov_model),
    }
    return Input(ov_model, _ir.input_hint(model, ov_model), facts)


def calibration_items(ctx: PassContext, name: str, model: ov.Model, limit: int | None = None) -> list[dict[str, np.ndarray]]:
    """One feed dict per sample of dataset ``name`` (batch 1), holding only the model's inputs."""
    data = ctx.dataset(name)
    if len(data) == 0:
        raise KilnError(f"dataset '{name}' holds no samples")
    ports = [(port_name(p, i, "input"), p) for i, p in enumerate(model.inputs)]
    missing = [n for n, _ in ports if n not in data.inputs]
    if missing:
        raise KilnError(
            f"dataset '{name}' lacks input(s) {', '.join(missing)} of the model "
            f"(dataset has: {', '.join(sorted(data.inputs))}; model takes: {', '.join(n for n, _ in ports)})"
        )
    items = []
    for batch in data.batches(1, limit=limit):
        item = {}
        for n, port in ports:
            array, wanted = batch[n], dtype_name(port.get_element_type())
            if array.dtype.name != wanted and array.dtype.kind in "iub" and wanted.startswith(("int", "uint", "bool")):
                array = array.astype(wanted)  # int32 token ids for an int64 input: same values
            item[n] = np.ascontiguousarray(array)
        items.append(item)
    _check_shapes(name, ports, items[0])
    return items


def _check_shapes(name: str, ports: list[tuple[str, Any]], item: dict[str, np.ndarray]) -> None:
    for n, port in ports:
        want, have = port_shape(port), item[n].shape
        if want and (len(want) != len(have) or any(w is not None and w != h for w, h in zip(want, have, strict=False))):
            raise KilnError(
                f"dataset '{name}' gives input {n} the shape {list(have)} per sample, but the model's input is "
                f"{['?' if w is None else w for w in want]}: reshape the model (openvino_convert input_shapes) or the data"
            )


def subset(size: int, available: int, notes: list[str]) -> int:
    if size > available:
        notes.append(f"subset_size {size} is more than the {available} calibration samples: calibrated on all {available}")
        return available
    return size


def quantize_arguments(cfg: QuantizeOptions, subset_size: int, advanced: str = "advanced_parameters") -> dict[str, Any]:
    """The arguments ``nncf.quantize`` and ``nncf.quantize_with_accuracy_control`` share, from the
    options both passes take (``advanced``: the name each gives its advanced parameters)."""
    return {
        "preset": preset(cfg.preset),
        "target_device": target_device(cfg.target_device),
        "subset_size": subset_size,
        "fast_bias_correction": cfg.fast_bias_correction,
        "model_type": model_type(cfg.model_type),
        "ignored_scope": None if cfg.ignored_scope.is_empty() else cfg.ignored_scope.to_nncf(),
        **({} if cfg.smooth_quant_alpha is None else {advanced: smooth_quant(cfg.smooth_quant_alpha)}),
    }


def smooth_quant(alpha: float) -> Any:
    """NNCF's advanced parameters with SmoothQuant's MatMul alpha set (convolutions left at NNCF's default, off)."""
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, AdvancedSmoothQuantParameters

    return AdvancedQuantizationParameters(smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=alpha))


def preset(name: str) -> Any:
    return {"performance": nncf.QuantizationPreset.PERFORMANCE, "mixed": nncf.QuantizationPreset.MIXED}[name]


def model_type(name: str | None) -> Any:
    return nncf.ModelType.TRANSFORMER if name == "transformer" else None


def target_device(name: str) -> Any:
    return getattr(nncf.TargetDevice, name)


def quantization_facts(before: Input, after: ov.Model) -> dict[str, Any]:
    counts = _ir.op_counts(after)
    return {
        "fake_quantize_nodes": counts.get("FakeQuantize", 0),
        "fake_convert_nodes": counts.get("FakeConvert", 0),
        "quantized_ops": _ir.quantized_ops(after),
        "node_count_before": before.facts["node_count"],
        "node_count_after": len(after.get_ops()),
        "weight_bytes_before": before.facts["weight_bytes"],
        "weight_bytes_after": _ir.weight_bytes(after),
    }


#: what ``nncf.quantize_with_accuracy_control`` adds to the model's ``nncf/quantization`` rt_info
#: beyond what ``nncf.quantize`` writes (it keeps the options it was given as
#: ``advanced_quantization_parameters`` and its own working copy, weights left uncompressed
#: while it may revert, as ``advanced_parameters``)
_ACCURACY_CONTROL_INFO = ("advanced_accuracy_restorer_parameters", "drop_type", "max_drop")


def as_plain_quantization(model: ov.Model) -> None:
    """Write an accuracy-controlled model that reverted nothing as ``nncf.quantize`` writes the
    same quantization, in place: its ``nncf`` rt_info without accuracy control's entries, the
    options it was given as ``advanced_parameters``. Its ops and weights already are that
    quantization's, so the two passes' models are then the same bytes (one digest, measured
    once); ``nncf_quantize_accuracy``'s record keeps what accuracy control measured."""
    info = model.get_rt_info()
    if "nncf" not in info:
        return
    entries = _rt_entries(info["nncf"], ["nncf"])
    here = ("nncf", "quantization")
    if (*here, "advanced_quantization_parameters") not in entries:
        return
    entries[(*here, "advanced_parameters")] = entries.pop((*here, "advanced_quantization_parameters"))
    for key in _ACCURACY_CONTROL_INFO:
        entries.pop((*here, key), None)
    del info["nncf"]  # nested rt_info is read as copies: the subtree is written anew, entry by entry
    for path, value in entries.items():
        model.set_rt_info(value, list(path))


def _rt_entries(node: Any, path: list[str]) -> dict[tuple[str, ...], str]:
    found: dict[tuple[str, ...], str] = {}
    for key, value in dict(node).items():
        if isinstance(value, dict):
            found.update(_rt_entries(value, [*path, key]))
        else:
            found[(*path, key)] = value.astype(str) if hasattr(value, "astype") else str(value)
    return found


def write(model: ov.Model, ctx: PassContext, hint: str | None) -> Path:
    return _ir.save_ir(model, Path(ctx.output_dir), hint)
