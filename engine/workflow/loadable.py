"""Whether an ONNX model can be opened by a runtime at all, checked without opening a session
(cheap enough for validation and for every candidate before it can be chosen):

- the ONNX checker on the file's path (``onnx.checker.check_model(path, full_check=False)``), so
  that it resolves the external data references against the model's folder;
- every external data file a tensor names exists as a regular file and holds the bytes the
  tensor points at (offset + length);
- every node's op domain is one onnxruntime knows: the ONNX domains (``onnx.defs``), its own
  contrib domains, and the model's local functions. A node of another domain needs a custom op
  library no Kiln target registers, and onnxruntime refuses such a model when it loads it.
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
    try:
        onnx.checker.check_model(str(model_file), full_check=False)
    except Exception as error:  # noqa: BLE001 - onnx.checker.ValidationError and the C++ errors it passes on
        return f"the ONNX checker refuses it: {str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}"
    return None
