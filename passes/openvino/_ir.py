"""Reading, describing and writing OpenVINO IR for the OpenVINO passes.

Every pass writes its model through ``save_ir``, which makes the files reproducible (same model,
same bytes): OpenVINO names the nodes nobody named (``Constant_111452``) from a process-wide
counter, so those names are replaced by names numbered in topological order; the converter's
``conversion_parameters`` (the input file's name) are dropped; and the model's precision hint is
written into its rt_info, where the openvino target reads it (see ``targets.openvino``).

Imported by the passes only when they run: it imports openvino.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import openvino as ov

from engine.core.artifact import ModelArtifact
from passes.openvino._base import MODEL_FILE
from targets.openvino import dtype_name, model_precision_hint, port_name, port_shape, set_model_precision_hint


def read_input(model: ModelArtifact) -> ov.Model:
    """An ONNX file or an IR as an ``ov.Model`` (OpenVINO reads ONNX directly)."""
    if model.format not in ("onnx", "openvino"):
        raise ValueError(f"cannot read a {model.format} model with OpenVINO")
    path = model.model_file
    if not path.is_file():
        raise ValueError(f"no model file at {path}")
    return ov.Core().read_model(str(path))


def read_ir(xml: Path) -> ov.Model:
    return ov.Core().read_model(str(xml))


def input_hint(model: ModelArtifact, ov_model: ov.Model) -> str | None:
    """The precision hint the input carries (ONNX files carry none)."""
    return model_precision_hint(ov_model) if model.format == "openvino" else None


#: a name OpenVINO makes from its counter: ``Constant_278``, or derived from one (``Constant_278_1``)
_COUNTER_NAME = re.compile(r"[A-Z][A-Za-z0-9]*(_[0-9]+)+")


def _generated(op: Any) -> bool:
    """Whether ``op``'s name is one OpenVINO made up: never set (friendly name == unique name), or
    of the counter form (read back from a file, given by a frontend, or derived by a transformation)."""
    name = op.get_friendly_name()
    return name == op.get_name() or _COUNTER_NAME.fullmatch(name) is not None


def canonical_names(model: ov.Model) -> int:
    """Rename the nodes whose names OpenVINO made up from a process-wide counter to
    ``<op type>_<k>``, numbered in topological order (and a ``Model<n>`` model to ``Model``);
    returns how many nodes were renamed. Tensor names (the model's input and output names) are
    not friendly names and stay as they are."""
    if re.fullmatch(r"Model[0-9]+", model.get_friendly_name()):  # Model0, Model14, ...
        model.set_friendly_name("Model")
    ops = list(model.get_ordered_ops())
    generated = [_generated(op) for op in ops]
    taken = {op.get_friendly_name() for op, made_up in zip(ops, generated, strict=True) if not made_up}
    counters: Counter[str] = Counter()
    for op, made_up in zip(ops, generated, strict=True):
        if not made_up:
            continue
        kind = op.get_type_name()
        while True:
            counters[kind] += 1
            name = f"{kind}_{counters[kind]}"
            if name not in taken:
                break
        op.set_friendly_name(name)
        taken.add(name)
    return sum(generated)


def save_ir(model: ov.Model, folder: Path, hint: str | None, compress_to_fp16: bool = False) -> Path:
    """Write ``folder/model.xml`` + ``model.bin`` reproducibly, carrying ``hint``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    canonical_names(model)
    info = model.get_rt_info()
    if "conversion_parameters" in info:
        del info["conversion_parameters"]  # names the input file: not part of the model
    set_model_precision_hint(model, hint)
    path = folder / MODEL_FILE
    ov.save_model(model, str(path), compress_to_fp16=compress_to_fp16)
    return path


def op_counts(model: ov.Model) -> dict[str, int]:
    return dict(sorted(Counter(op.get_type_name() for op in model.get_ops()).items()))


def weight_bytes(model: ov.Model) -> dict[str, int]:
    """Bytes of constant data by element type (f32, f16, i8, u4, ...), plus ``total``."""
    sizes: Counter[str] = Counter()
    for op in model.get_ops():
        if op.get_type_name() == "Constant":
            sizes[op.get_element_type().get_type_name()] += int(op.get_byte_size())
    return {**dict(sorted(sizes.items())), "total": sum(sizes.values())}


#: element types of quantized weights
LOW_PRECISION = frozenset({"i8", "u8", "i4", "u4", "nf4", "f4e2m1", "f8e4m3", "f8e5m2", "i2", "u2", "u3"})
#: ops between a quantized weight constant and the op using it (decompression: convert, shift, scale)
_DECOMPRESSION = frozenset({"Convert", "Subtract", "Multiply", "Reshape"})


def _quantized_source(node: Any, depth: int = 0) -> bool:
    kind = node.get_type_name()
    if kind == "FakeQuantize" or kind == "FakeConvert":
        return True
    if kind == "Constant":
        return node.get_element_type().get_type_name() in LOW_PRECISION
    if kind in _DECOMPRESSION and depth < 4:
        return any(_quantized_source(value.get_node(), depth + 1) for value in node.input_values())
    return False


def quantized_op_names(model: ov.Model) -> dict[str, str]:
    """Ops with a quantized input (a FakeQuantize, or low-precision weights being decompressed):
    friendly name -> op type."""
    found = {}
    for op in model.get_ordered_ops():
        kind = op.get_type_name()
        if kind in _DECOMPRESSION or kind in ("FakeQuantize", "FakeConvert", "Constant", "Result", "ShapeOf"):
            continue
        if any(_quantized_source(value.get_node()) for value in op.input_values()):
            found[op.get_friendly_name()] = kind
    return found


def quantized_ops(model: ov.Model) -> dict[str, int]:
    """Quantized ops by type (MatMul: 12)."""
    return dict(sorted(Counter(quantized_op_names(model).values()).items()))


def describe_io(ports: Any, kind: str) -> list[dict[str, Any]]:
    return [
        {"name": port_name(p, i, kind), "dtype": dtype_name(p.get_element_type()), "shape": list(port_shape(p))}
        for i, p in enumerate(ports)
    ]


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
