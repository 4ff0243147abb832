"""Renames: graph inputs, and dimensions of inputs and outputs made symbolic. A rename whose
target does not exist is an error (the option names something the model lacks)."""

from __future__ import annotations

import onnx_ir as ir

from passes.graph.surgeons.ir_tools import used_names
from passes.graph.surgeons.specs import Outcome, RenameInputDims, RenameInputs, RenameOutputDims, applied, not_applied


def _rename_dim(value: ir.Value, dim_idx: int, dim_name: str, what: str) -> Outcome:
    if value.shape is None:
        raise ValueError(f"{what} {value.name!r} has no shape to rename a dimension of")
    if dim_idx >= len(value.shape):
        raise ValueError(f"dim_idx {dim_idx} is out of range: {what} {value.name!r} has {len(value.shape)} dimensions")
    dims = list(value.shape)
    if isinstance(dims[dim_idx], ir.SymbolicDim) and dims[dim_idx].value == dim_name:
        return not_applied(f"dimension {dim_idx} of {what} {value.name!r} is already named {dim_name!r}")
    old = dims[dim_idx]
    dims[dim_idx] = dim_name
    value.shape = ir.Shape(dims)
    return applied(1, f"{what} {value.name!r} dimension {dim_idx}: {old} -> {dim_name}")


def rename_output_dims(model: ir.Model, spec: RenameOutputDims) -> Outcome:
    outputs = model.graph.outputs
    if spec.output_idx >= len(outputs):
        raise ValueError(f"output_idx {spec.output_idx} is out of range: the model has {len(outputs)} outputs")
    return _rename_dim(outputs[spec.output_idx], spec.dim_idx, spec.dim_name, "output")


def rename_input_dims(model: ir.Model, spec: RenameInputDims) -> Outcome:
    inputs = list(model.graph.inputs)
    if spec.input_name is not None:
        found = [value for value in inputs if value.name == spec.input_name]
        if not found:
            raise ValueError(f"no input {spec.input_name!r}; the inputs are {[value.name for value in inputs]}")
        target = found[0]
    else:
        assert spec.input_idx is not None
        if spec.input_idx >= len(inputs):
            raise ValueError(f"input_idx {spec.input_idx} is out of range: the model has {len(inputs)} inputs")
        target = inputs[spec.input_idx]
    return _rename_dim(target, spec.dim_idx, spec.dim_name, "input")


def rename_inputs(model: ir.Model, spec: RenameInputs) -> Outcome:
    """A graph input's value is the one its consumers read: renaming it renames it everywhere."""
    graph = model.graph
    by_name = {value.name: value for value in graph.inputs}
    missing = [name for name in spec.old_names if name not in by_name]
    if missing:
        raise ValueError(f"no input {', '.join(map(repr, missing))}; the inputs are {list(by_name)}")
    taken = used_names(graph, node_names=False) - set(spec.old_names)
    clashes = [name for name in spec.new_names if name in taken]
    if clashes:
        raise ValueError(f"new_names {clashes} are already names of values in the graph")
    renamed = 0
    for old, new in zip(spec.old_names, spec.new_names, strict=True):
        if old != new:
            by_name[old].name = new
            renamed += 1
    return applied(renamed) if renamed else not_applied("every new name equals the old one")
