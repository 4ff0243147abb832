"""Run torch's ONNX exporters on an ``ExportSource`` and make what they write reproducible.

Imported by ``torch_export`` only when the pass runs: torch and onnx are heavy.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from passes.export.sources import ExportSource


def torchscript_max_opset() -> int:
    """The highest opset the TorchScript exporter writes (20 in torch 2.13)."""
    from torch.onnx import _constants  # private, but the only place torch states it

    return int(getattr(_constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", 20))


def output_axes(source: ExportSource, outputs: list[np.ndarray], alternate: list[np.ndarray]) -> dict[str, dict[int, str]]:
    """Name the output axes whose size changed between the two examples, after the input axis
    that changed the same way ("batch", "sequence"), else ``<output>_dim<i>``."""
    axes: dict[str, dict[int, str]] = {}
    for name, first, second in zip(source.output_names, outputs, alternate, strict=True):
        if first.ndim != second.ndim:
            raise ValueError(f"output {name} has rank {first.ndim} at one input size and {second.ndim} at another")
        axes[name] = {}
        for axis, sizes in enumerate(zip(first.shape, second.shape, strict=True)):
            if sizes[0] != sizes[1]:
                axes[name][axis] = next((label for label, known in source.axis_sizes.items() if known == sizes), f"{name}_dim{axis}")
    return axes


def fix_output_dims(model: onnx.ModelProto, names: list[str], outputs: list[np.ndarray], axes: dict[str, dict[int, str]]) -> None:
    """Give the output axes that kept their size between the two examples (those ``axes`` does not
    name) that size, where the TorchScript exporter left a symbolic name of its own
    (``LayerNormalizationlast_hidden_state_dim_1``)."""
    sizes = dict(zip(names, outputs, strict=True))
    for value in model.graph.output:
        if value.name not in sizes:
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if axis not in axes.get(value.name, {}) and dim.dim_param and axis < sizes[value.name].ndim:
                dim.dim_value = int(sizes[value.name].shape[axis])  # clears dim_param: one of the two is set


#: models whose parameters take less than this are exported into memory (no file written, then read back)
IN_MEMORY_BYTES = 1 << 30


def export(
    source: ExportSource, exporter: str, opset: int, out_axes: dict[str, dict[int, str]] | None, folder: Path
) -> tuple[onnx.ModelProto, list[str]]:
    """Export the model (into ``folder`` where it goes through a file); returns it, with external
    data read in, and the warnings the exporter raised.

    ``out_axes`` is None for a static export; otherwise the inputs' axes in ``source.input_axes``
    and these output axes are dynamic. A TorchScript export of a model under ``IN_MEMORY_BYTES``
    is written into memory: its file would only be read back.
    """
    path = folder / "model.onnx"
    args = tuple(source.example[name] for name in source.input_names)
    common: dict[str, Any] = {"input_names": source.input_names, "output_names": source.output_names, "opset_version": opset}
    in_memory = exporter == "torchscript" and _parameter_bytes(source.module) < IN_MEMORY_BYTES
    buffer = io.BytesIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("always")
        if exporter == "torchscript":
            dynamic_axes = None if out_axes is None else {**source.input_axes, **{k: v for k, v in out_axes.items() if v}}
            torch.onnx.export(
                source.module,
                args,
                buffer if in_memory else str(path),
                dynamo=False,
                dynamic_axes=dynamic_axes,
                do_constant_folding=True,
                **common,
            )
        else:
            dynamic_shapes = _dynamic_shapes(source) if out_axes is not None else None
            torch.onnx.export(
                source.module,
                args,
                str(path),
                dynamo=True,
                dynamic_shapes=dynamic_shapes,
                external_data=True,
                optimize=True,
                verbose=False,
                report=False,
                **common,
            )
    source.module.eval()  # the TorchScript exporter restores the wrapper's (training) mode on exit
    # external data, if the exporter wrote any, is read in too
    model = onnx.load_from_string(buffer.getvalue()) if in_memory else onnx.load(str(path))
    return model, sorted({str(w.message).splitlines()[0] for w in caught if str(w.message)})


def failure(source: ExportSource, exporter: str, error: BaseException) -> str:
    """What to say when torch's exporter fails: the model's class and task, the exporter's first
    line, and the other exporter to try."""
    inner = getattr(source.module, "model", source.module)
    what = type(inner).__name__ + (f" ({source.attrs['task']})" if source.attrs.get("task") else "")
    first = next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)[:400]
    other = "dynamo" if exporter == "torchscript" else "torchscript"
    return f"torch's {exporter} exporter cannot export {what}: {first}; try exporter: {other}, or export the model yourself and give the .onnx file"


def _parameter_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def _dynamic_shapes(source: ExportSource) -> tuple[tuple[dict[int, Any] | None, ...]]:
    """torch.export's form for a ``forward(*tensors)``: one entry, for ``tensors``, per input."""
    dims: dict[str, Any] = {}
    specs = []
    for name in source.input_names:
        axes = source.input_axes.get(name)
        specs.append({axis: dims.setdefault(label, torch.export.Dim(label)) for axis, label in axes.items()} if axes else None)
    return (tuple(specs),)


def make_reproducible(model: onnx.ModelProto) -> None:
    """Drop what changes between two exports of the same model: doc strings and the dynamo
    exporter's metadata (stack traces with file paths, Python module names, FX node dumps)."""
    model.doc_string = ""
    for entry in list(model.metadata_props):
        if entry.key.startswith("pkg."):
            model.metadata_props.remove(entry)
    _strip_graph(model.graph)
    for function in model.functions:
        function.doc_string = ""
        del function.metadata_props[:]
        for node in function.node:
            _strip_node(node)


def _strip_graph(graph: onnx.GraphProto) -> None:
    graph.doc_string = ""
    del graph.metadata_props[:]
    for node in graph.node:
        _strip_node(node)
    for item in [*graph.input, *graph.output, *graph.value_info, *graph.initializer]:
        item.doc_string = ""
        del item.metadata_props[:]


def _strip_node(node: onnx.NodeProto) -> None:
    node.doc_string = ""
    del node.metadata_props[:]
    for attribute in node.attribute:
        attribute.doc_string = ""
        if attribute.HasField("g"):
            _strip_graph(attribute.g)
        for graph in attribute.graphs:
            _strip_graph(graph)


def describe_io(values: Any) -> list[dict[str, Any]]:
    """Name, numpy dtype and shape (a dim name where the axis is dynamic) of graph inputs/outputs."""
    described = []
    for value in values:
        tensor = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else None
        shape = [dim.dim_param or (dim.dim_value if dim.HasField("dim_value") else None) for dim in tensor.shape.dim]
        described.append({"name": value.name, "dtype": dtype, "shape": shape})
    return described
