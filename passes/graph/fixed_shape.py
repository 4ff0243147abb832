"""Dynamic dimensions made fixed: Olive's ``DynamicToFixedShape`` with its options. Either symbolic
dims by name (``dim_param: [batch, sequence]``, ``dim_value: [1, 128]``) or whole input shapes
(``input_name: [input_ids]``, ``input_shape: [[1, 128]]``), set with onnxruntime's own tool
(``onnxruntime.tools.onnx_model_utils``); the output shapes are then inferred where they became
fixed. NPU execution providers (QNN, VitisAI) and static-shape compilers need this.

A dim or input the model does not have is an error (onnxruntime's tool silently skips an unknown
dim). The details list what stays symbolic after ONNX shape inference; ``require_static`` makes
that a failure.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import Field, PositiveInt, model_validator

from engine.core import ModelArtifact, PassContext, PassResult
from passes.common.external_data import ExternalDataOptions, save_with_options
from passes.common.onnx_io import OnnxPass
from passes.common.pass_io import onnx_output, require


class FixedShape(OnnxPass):
    name = "fixed_shape"
    summary = "Make dynamic dims and input shapes of an ONNX model fixed (Olive's DynamicToFixedShape), with onnxruntime's tool."
    version = "1"
    accepts = ("onnx", "genai")
    produces = "onnx"
    keeps = ("genai",)
    libraries = ("onnx", "onnxruntime")

    class Config(ExternalDataOptions):
        dim_param: list[str] | None = Field(None, description="Symbolic dim names to fix, with dim_value (as Olive's dim_param).")
        dim_value: list[PositiveInt] | None = Field(None, description="The value of each dim_param, in the same order.")
        input_name: list[str] | None = Field(None, description="Graph inputs whose whole shape to fix, with input_shape.")
        input_shape: list[list[PositiveInt]] | None = Field(None, description="The shape of each input_name, e.g. [[1, 3, 224, 224]].")
        require_static: bool = Field(False, description="Fail when any dim stays symbolic after the fix (ONNX shape inference).")

        @model_validator(mode="after")
        def _pairs(self) -> FixedShape.Config:
            if bool(self.dim_param) == bool(self.input_name):
                raise ValueError("give either dim_param (with dim_value) or input_name (with input_shape), not both or neither")
            for names, values, what in ((self.dim_param, self.dim_value, "dim"), (self.input_name, self.input_shape, "input")):
                if names is None and values is None:
                    continue
                if names is None or values is None or len(names) != len(values):
                    raise ValueError(f"{what}: the names and the values must be given together, one value per name")
                if len(set(names)) != len(names):
                    raise ValueError(f"{what}: names a {what} twice: {names}")
            return self

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        import onnx

        (utils,) = require("onnxruntime", self.name, "onnxruntime.tools.onnx_model_utils")
        cfg = self.config
        proto = onnx.load(str(model.model_file))  # external data is read in too
        before = symbolic_dims(proto)
        if cfg.dim_param and cfg.dim_value:
            missing = [name for name in cfg.dim_param if name not in before]
            if missing:
                known = ", ".join(sorted(before)) or "none"
                raise ValueError(f"dim_param: the model has no symbolic dim {', '.join(missing)} (its symbolic dims: {known})")
            for name, value in zip(cfg.dim_param, cfg.dim_value, strict=True):
                utils.make_dim_param_fixed(proto.graph, name, value)
        elif cfg.input_name and cfg.input_shape:
            inputs = [item.name for item in proto.graph.input]
            missing = [name for name in cfg.input_name if name not in inputs]
            if missing:
                raise ValueError(f"input_name: the model has no input {', '.join(missing)} (its inputs: {', '.join(inputs)})")
            for name, shape in zip(cfg.input_name, cfg.input_shape, strict=True):
                utils.make_input_shape_fixed(proto.graph, name, shape)
        _fix_outputs(proto, utils)
        remaining = symbolic_dims(onnx.shape_inference.infer_shapes(proto))
        if cfg.require_static and remaining:
            listing = "; ".join(f"{dim} ({', '.join(names[:3])})" for dim, names in sorted(remaining.items()))
            raise ValueError(f"require_static: dims stay symbolic after the fix: {listing}")
        save_with_options(proto, Path(ctx.output_dir), cfg)
        details: dict[str, Any] = {
            "fixed": dict(zip(cfg.dim_param, cfg.dim_value, strict=True)) if cfg.dim_param and cfg.dim_value else {},
            "fixed_inputs": dict(zip(cfg.input_name, cfg.input_shape, strict=True)) if cfg.input_name and cfg.input_shape else {},
            "symbolic_before": sorted(before),
            "symbolic_after": {dim: names for dim, names in sorted(remaining.items())},
            "inputs": {item.name: _shape(item) for item in proto.graph.input},
            "outputs": {item.name: _shape(item) for item in proto.graph.output},
        }
        notes = [f"dims still symbolic: {', '.join(sorted(remaining))}"] if remaining else []
        return onnx_output(model, ctx, details, notes)


UNKNOWN = "?"  # a dim with neither a value nor a name


def _tensors(model: Any) -> Iterable[Any]:
    graph = model.graph
    yield from graph.input
    yield from graph.output
    yield from graph.value_info


def symbolic_dims(model: Any) -> dict[str, list[str]]:
    """Symbolic dims of the graph's inputs, outputs and inferred tensors: dim name -> tensor names
    (a dim with no name or value is listed under ``?``)."""
    found: dict[str, list[str]] = {}
    for item in _tensors(model):
        if not item.type.HasField("tensor_type") or not item.type.tensor_type.HasField("shape"):
            continue
        for dim in item.type.tensor_type.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value > 0:
                continue
            key = dim.dim_param if dim.HasField("dim_param") else UNKNOWN
            names = found.setdefault(key, [])
            if item.name not in names:
                names.append(item.name)
    return found


def _shape(item: Any) -> list[int | str]:
    dims = item.type.tensor_type.shape.dim if item.type.HasField("tensor_type") else []
    return [dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or UNKNOWN) for dim in dims]


def _fix_outputs(proto: Any, utils: Any) -> None:
    """Fixed output shapes where shape inference finds them: onnxruntime's ``fix_output_shapes``
    (ONNX shape inference), or onnxruntime's symbolic shape inference for what ONNX's cannot infer
    (contrib ops, onnxruntime's ops in the default domain), as Olive does."""
    try:
        utils.fix_output_shapes(proto)
    except Exception:  # noqa: BLE001 - its onnx.checker refuses onnxruntime's ops in the default domain (genai decoders)
        pass
    if all(utils.is_fixed_size_tensor(output) for output in proto.graph.output):
        return
    (symbolic,) = require("onnxruntime", "fixed_shape", "onnxruntime.tools.symbolic_shape_infer")
    try:
        inferred = symbolic.SymbolicShapeInference.infer_shapes(proto, auto_merge=True, guess_output_rank=True)
    except Exception:  # noqa: BLE001 - the outputs stay as ONNX inference left them, and are reported
        return
    for index, output in enumerate(proto.graph.output):
        new = inferred.graph.output[index]
        if not utils.is_fixed_size_tensor(output) and utils.is_fixed_size_tensor(new):
            output.type.tensor_type.shape.CopyFrom(new.type.tensor_type.shape)
