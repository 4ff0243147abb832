"""Whether an ONNX model can be opened by a runtime at all, checked without opening a session
(cheap enough for validation and for every candidate before it can be chosen):

- the ONNX checker on the file's path (``onnx.checker.check_model(path, full_check=False)``), so
  that it resolves the external data references against the model's folder;
- every external data file a tensor names exists as a regular file and holds the bytes the
  tensor points at (offset + length);
- every node's op domain is one onnxruntime knows: the ONNX domains (``onnx.defs``), its own
  contrib domains, and the model's local functions. A node of another domain needs a custom op
  library no Kiln target registers, and onnxruntime refuses such a model when it loads it;
- every graph output is produced by a node, a graph input or an initializer (onnxruntime refuses
  the model otherwise: "Graph output (present.0.key) does not exist in the graph", which is what
  ONNX Runtime GenAI 0.18's builder writes for fp32 on CUDA).

A model holding onnxruntime's own ops in the default domain (``SimplifiedLayerNormalization``,
which ONNX Runtime GenAI's model builder writes there) is checked on a copy without its external
weights (they become graph inputs of the same type and shape; their files are checked above) in
which those nodes carry onnxruntime's contrib domain: onnx.checker has no schema for them in the
default domain, and refuses the model although onnxruntime opens it.

It lives in the SDK so that the pass contract (``passes.common.onnx_io``) and the engine (the
input at validation, every candidate before it is measured) run the same check.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: the op domains onnxruntime implements beside ONNX's (contrib ops and its internal layouts)
ORT_DOMAINS = frozenset(
    {"com.microsoft", "com.microsoft.nchwc", "com.microsoft.experimental", "com.microsoft.dml", "com.ms.internal.nhwc", "org.pytorch.aten"}
)


def _nodes(graph: Any) -> Iterator[Any]:
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.g.node:
                yield from _nodes(attribute.g)
            for sub in attribute.graphs:
                yield from _nodes(sub)


#: ops onnxruntime implements in the default ONNX domain that ONNX itself does not define
ORT_DEFAULT_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization"})


def unproduced_outputs(graph: Any) -> list[str]:
    """The graph outputs that no node, graph input or initializer produces."""
    produced = {name for node in graph.node for name in node.output if name}
    produced |= {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
    return [value.name for value in graph.output if value.name not in produced]


def _checker_copy(model: Any) -> Any:
    """A copy of ``model`` (read without its external data) that onnx.checker can judge: external
    weights as graph inputs, onnxruntime's default-domain ops in its contrib domain."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    inline = []
    for tensor in graph.initializer:
        if uses_external_data(tensor):
            graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
        else:
            inline.append(tensor)
    del graph.initializer[:]
    graph.initializer.extend(inline)
    for node in _nodes(graph):
        if node.domain in ("", "ai.onnx") and node.op_type in ORT_DEFAULT_DOMAIN_OPS:
            node.domain = "com.microsoft"
    if not any(entry.domain == "com.microsoft" for entry in copy.opset_import):
        copy.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return copy


def onnx_load_problem(model_file: Path) -> str | None:
    """Why no runtime could load the ONNX model at ``model_file``, or None."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    try:
        model = onnx.load(str(model_file), load_external_data=False)
    except Exception as error:  # noqa: BLE001 - a protobuf that does not parse: the reason is the answer
        return f"it cannot be read as an ONNX model: {error}"
    folder = model_file.parent
    for tensor in _get_all_tensors(model):
        if not uses_external_data(tensor):
            continue
        info = ExternalDataInfo(tensor)
        data = folder / info.location
        if not data.exists() and not data.is_symlink():
            return f"its external data file {info.location} (tensor {tensor.name}) is missing"
        if data.is_symlink() or not data.is_file():
            return f"its external data file {info.location} (tensor {tensor.name}) is not a regular file"
        end = (info.offset or 0) + (info.length or 0)
        if info.length and end > data.stat().st_size:
            return f"its external data file {info.location} holds {data.stat().st_size} bytes; tensor {tensor.name} needs {end}"
    known = {schema.domain for schema in onnx.defs.get_all_schemas_with_history()} | {"", "ai.onnx"} | ORT_DOMAINS
    known |= {function.domain for function in model.functions}
    unknown = sorted({node.domain for node in _nodes(model.graph) if node.domain not in known})
    for function in model.functions:
        unknown += sorted({node.domain for node in function.node if node.domain not in known and node.domain not in unknown})
    if unknown:
        return f"it uses ops of domain{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}, which onnxruntime does not implement"
    missing = unproduced_outputs(model.graph)
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        return f"its graph output{'s' if len(missing) > 1 else ''} {shown} {'are' if len(missing) > 1 else 'is'} produced by no node"
    own_ops = any(node.domain in ("", "ai.onnx") and node.op_type in ORT_DEFAULT_DOMAIN_OPS for node in _nodes(model.graph))
    try:
        if own_ops:
            onnx.checker.check_model(_checker_copy(model), full_check=False)
        else:
            onnx.checker.check_model(str(model_file), full_check=False)
    except Exception as error:  # noqa: BLE001 - onnx.checker.ValidationError and the C++ errors it passes on
        return f"the ONNX checker refuses it: {str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}"
    return None
