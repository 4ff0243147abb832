"""Compose the parts of an ``onnx_parts`` folder (``split_model``'s output) back into one ONNX
model, as Olive's ComposeOnnxModels does: the parts' nodes in the manifest's order, each part's
inputs wired to the earlier parts' outputs of the same name, initializers and functions kept once,
the whole model's inputs and outputs as the manifest lists them. Nodes that several parts hold
(constants copied into every part that reads them) are kept once. The result passes
``onnx.checker``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core import ModelArtifact, PassConfig, PassContext, PassResult
from passes.common.onnx_io import OnnxPass, save_onnx
from passes.graph._parts import MANIFEST

if TYPE_CHECKING:
    import onnx


class ComposeModels(OnnxPass):
    name = "compose_models"
    summary = "Compose the parts of a split model (onnx_parts: split.json + model_<i>.onnx) back into one ONNX model."
    version = "1"
    accepts = ("onnx_parts",)
    produces = "onnx"
    libraries = ("onnx",)

    class Config(PassConfig):
        pass

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        import onnx

        folder = Path(model.path)
        manifest = json.loads((folder / MANIFEST).read_text())
        parts = [onnx.load(str(folder / entry["file"])) for entry in manifest["parts"]]
        if not parts:
            raise ValueError(f"{MANIFEST} lists no parts")
        composed = compose(parts, manifest["inputs"], manifest["outputs"])
        onnx.checker.check_model(composed, full_check=False)
        save_onnx(composed, Path(ctx.output_dir))
        details: dict[str, Any] = {
            "parts": len(parts),
            "nodes": len(composed.graph.node),
            "initializers": len(composed.graph.initializer),
            "inputs": [value.name for value in composed.graph.input],
            "outputs": [value.name for value in composed.graph.output],
        }
        return PassResult(model=ModelArtifact.from_folder("onnx", Path(ctx.output_dir), attrs=model.attrs), details=details)


def compose(parts: list[onnx.ModelProto], inputs: list[str], outputs: list[str]) -> onnx.ModelProto:  # long: one merge walk
    """One model from parts run in order: a part's input that an earlier part computes is wired to
    it by name; ``inputs``/``outputs``: the composed model's, by name."""
    from onnx import helper

    nodes: list[onnx.NodeProto] = []
    made: set[str] = set()
    initializers: dict[str, onnx.TensorProto] = {}
    values: dict[str, onnx.ValueInfoProto] = {}
    value_info: dict[str, onnx.ValueInfoProto] = {}
    functions: dict[tuple[str, str, str], onnx.FunctionProto] = {}
    opsets: dict[str, int] = {}
    for index, part in enumerate(parts):
        graph = part.graph
        for value in [*graph.input, *graph.output]:
            values.setdefault(value.name, value)
        for value in graph.value_info:
            value_info.setdefault(value.name, value)
        missing = [value.name for value in graph.input if value.name not in made and value.name not in inputs]
        if missing:
            raise ValueError(f"part {index} reads {missing}, which no earlier part computes and the model does not take as input")
        for tensor in graph.initializer:
            initializers.setdefault(tensor.name, tensor)
        for node in graph.node:
            computed = [name for name in node.output if name]
            if computed and all(name in made for name in computed):
                continue  # a copy of a node an earlier part holds (a constant)
            nodes.append(node)
            made.update(computed)
        for function in part.functions:
            functions.setdefault((function.domain, function.name, getattr(function, "overload", "")), function)
        for opset in part.opset_import:
            opsets[opset.domain] = max(opsets.get(opset.domain, 0), opset.version)
    absent = [name for name in outputs if name not in made]
    if absent:
        raise ValueError(f"no part computes the model outputs {absent}")
    boundary = set(inputs) | set(outputs)
    inner = [value_info[name] for name in value_info if name not in boundary]
    inner += [values[name] for name in values if name not in boundary and name not in value_info and name in made]
    first = parts[0]
    graph = helper.make_graph(
        nodes,
        first.graph.name.removesuffix("_part_0") or "composed",
        [values[name] for name in inputs],
        [values[name] for name in outputs],
        list(initializers.values()),
        value_info=inner,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(domain, version) for domain, version in opsets.items()],
        ir_version=max(part.ir_version for part in parts),
        producer_name=first.producer_name,
    )
    model.functions.extend(functions.values())
    model.metadata_props.extend(first.metadata_props)
    return model
