"""The parts of an ``onnx_parts`` folder: cutting them out of a graph (``split_model``), saving
them, and the genai pipeline config."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core import ModelArtifact
from passes.common.onnx_io import EXTERNAL_DATA_THRESHOLD, clamp_ir_version
from passes.graph._split_plan import node_inputs

if TYPE_CHECKING:
    import onnx

MANIFEST = "split.json"
GENAI_CONFIG = "genai_config.json"
Part = tuple["onnx.ModelProto", list[str], list[str]]


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """The bytes of a tensor's data from its type and shape (external data need not be loaded)."""
    from onnx import TensorProto, helper

    if tensor.data_type in (TensorProto.INT4, TensorProto.UINT4):
        return (math.prod(tensor.dims) + 1) // 2
    if tensor.data_type == TensorProto.STRING:
        return sum(len(item) for item in tensor.string_data)
    return math.prod(tensor.dims) * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Every typed value of the graph, after onnx's shape inference."""
    import onnx

    graph = model.graph
    try:
        graph = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    except Exception:  # noqa: BLE001 - ops onnx does not know: keep the types the model holds
        pass
    return {value.name: value for value in [*graph.value_info, *graph.input, *graph.output] if value.type.HasField("tensor_type")}


def extract_parts(model: onnx.ModelProto, node_parts: list[set[int]]) -> list[Part]:  # long: one walk over the parts
    """The parts as models with their input and output names, parts numbered 0..N-1 in order."""
    from onnx import helper

    graph = model.graph
    count = max(max(parts) for parts in node_parts) + 1
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    graph_inputs = [value.name for value in graph.input if value.name not in initializers]
    graph_outputs = {value.name for value in graph.output}
    produced_in: dict[str, set[int]] = {}
    read_in: dict[str, set[int]] = {}
    for node, parts in zip(graph.node, node_parts, strict=True):
        for name in node.output:
            produced_in.setdefault(name, set()).update(parts)
        for name in node_inputs(node):
            read_in.setdefault(name, set()).update(parts)
    unproduced = [name for name in graph_outputs if name not in produced_in]
    if unproduced:
        raise ValueError(f"graph outputs no node computes (inputs or initializers passed through): {sorted(unproduced)}")
    types = _value_types(model)
    result: list[Part] = []
    for part in range(count):
        nodes = [node for node, parts in zip(graph.node, node_parts, strict=True) if part in parts]
        made = {name for node in nodes for name in node.output if name}
        used: list[str] = []
        for node in nodes:
            used.extend(name for name in node_inputs(node) if name and name not in made and name not in used)
        inputs = [name for name in graph_inputs if name in used]
        inputs += [name for name in used if name not in initializers and name not in inputs]
        outputs = [
            name
            for node in nodes
            for name in node.output
            if name and (name in graph_outputs or any(reader not in produced_in[name] for reader in read_in.get(name, ())))
        ]
        untyped = [name for name in inputs + outputs if name not in types]
        if untyped:
            raise ValueError(f"part {part}: no type for {untyped} (shape inference did not reach them)")
        inner = [value for value in graph.value_info if value.name in made and value.name not in outputs]
        part_graph = helper.make_graph(
            nodes,
            f"{graph.name}_part_{part}",
            [types[name] for name in inputs],
            [types[name] for name in outputs],
            [initializers[name] for name in used if name in initializers],
            value_info=inner,
        )
        part_model = helper.make_model(
            part_graph, opset_imports=list(model.opset_import), ir_version=model.ir_version, producer_name=model.producer_name or "kiln"
        )
        part_model.functions.extend(model.functions)
        part_model.metadata_props.extend(model.metadata_props)
        result.append((part_model, inputs, outputs))
    return result


def save_part(model: onnx.ModelProto, out: Path, index: int) -> str:
    """Save a part as ``model_<index>.onnx`` (weights over ~1.8 GB beside it as external data)."""
    import onnx

    clamp_ir_version(model)
    name = f"model_{index}.onnx"
    if sum(tensor_bytes(tensor) for tensor in model.graph.initializer) > EXTERNAL_DATA_THRESHOLD:
        onnx.save_model(
            model, str(out / name), save_as_external_data=True, all_tensors_to_one_file=True, location=f"{name}.data", size_threshold=1024
        )
    else:
        onnx.save_model(model, str(out / name))
    return name


def write_pipeline_config(model: ModelArtifact, out: Path, entries: list[dict[str, Any]]) -> list[str]:
    """Copy a genai folder's other files into ``out`` and make its genai_config.json an ONNX
    Runtime GenAI ``decoder-pipeline`` over the parts (every part runs on the prompt and on each
    generated token). Returns notes."""
    from passes.common.pass_io import copy_genai_sidecars

    copy_genai_sidecars(model, out)
    config_file = out / GENAI_CONFIG
    if not config_file.is_file():
        return ["the genai folder has no genai_config.json: the parts are written without a pipeline config"]
    config = json.loads(config_file.read_text())
    decoder = config["model"]["decoder"]
    decoder.pop("filename", None)
    config["model"]["type"] = "decoder-pipeline"
    decoder["pipeline"] = [
        {
            entry["name"]: {
                "filename": entry["file"],
                "inputs": entry["inputs"],
                "outputs": entry["outputs"],
                "run_on_prompt": True,
                "run_on_token_gen": True,
            }
            for entry in entries
        }
    ]
    config_file.write_text(json.dumps(config, indent=4) + "\n")
    return []
