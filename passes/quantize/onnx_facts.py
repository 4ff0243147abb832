"""Facts about an ONNX graph that a quantization pass reports: op counts, what was quantized, sizes.

Every function takes an ``onnx.ModelProto`` (or a path) and imports onnx only when called, so
importing this module stays free (the engine imports pass modules just to read their configs).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

#: Op types onnxruntime's quantizers emit (default domain and com.microsoft), besides the
#: ``QLinear*`` family (QLinearAdd, QLinearMul, QLinearSoftmax...), which ``is_quantized_op`` adds.
#: A count of these that grew between input and output is what "the pass quantized something" means.
QUANTIZED_OP_TYPES = frozenset(
    {
        "DynamicQuantizeLinear",
        "QuantizeLinear",
        "DequantizeLinear",
        "MatMulInteger",
        "ConvInteger",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
        "QAttention",
        "QEmbedLayerNormalization",
        "DynamicQuantizeLSTM",
        "QLinearMatMul",
        "QLinearConv",
        "QGemm",
    }
)

_INT8_TYPES = (2, 3)  # onnx.TensorProto.UINT8, onnx.TensorProto.INT8


def is_quantized_op(op_type: str) -> bool:
    return op_type in QUANTIZED_OP_TYPES or op_type.startswith("QLinear")


def iter_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph``, including those of its subgraphs (If / Loop / Scan bodies)."""
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.g.node:
                yield from iter_nodes(attribute.g)
            for sub in attribute.graphs:
                yield from iter_nodes(sub)


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """How many nodes of each op type, sorted by op type."""
    counts = Counter(node.op_type for node in iter_nodes(model.graph))
    return dict(sorted(counts.items()))


def node_names(model: onnx.ModelProto) -> set[str]:
    return {node.name for node in iter_nodes(model.graph) if node.name}


def new_quantized_ops(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Quantized op types the output has more of than the input, with how many more."""
    grown = {op: after[op] - before.get(op, 0) for op in after if is_quantized_op(op)}
    return {op: n for op, n in sorted(grown.items()) if n > 0}


def unquantized_nodes(model: onnx.ModelProto, op_types: list[str], qdq: bool = False) -> dict[str, int]:
    """How many nodes of ``op_types`` the quantizer left as they were, by op type: MatMuls of two
    activations (attention), Gathers of shape values, excluded nodes...

    A node counts as quantized when it reads an 8-bit initializer, the output of a quantize op
    (a quantized Gather or Transpose keeps its op type) or, in a QDQ model (``qdq``), the output
    of a DequantizeLinear (a QDQ MatMul stays a MatMul between DequantizeLinear and
    QuantizeLinear). Quantized MatMuls and Convs of the other formats change op type.
    """
    eight_bit = {t.name for t in model.graph.initializer if t.data_type in _INT8_TYPES}
    markers = ("DynamicQuantizeLinear", "QuantizeLinear", *(("DequantizeLinear",) if qdq else ()))
    eight_bit.update(n.output[0] for n in iter_nodes(model.graph) if n.op_type in markers and n.output)
    wanted = set(op_types)
    left: Counter[str] = Counter()
    for node in iter_nodes(model.graph):
        if node.op_type in wanted and not eight_bit.intersection(node.input):
            left[node.op_type] += 1
    return dict(sorted(left.items()))


def initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the weights (element count x element size; external data counted too)."""
    import onnx  # heavy: imported on use, see the module docstring

    total = 0
    for tensor in model.graph.initializer:
        count = 1
        for dim in tensor.dims:
            count *= int(dim)
        if tensor.data_type == onnx.TensorProto.STRING:
            total += sum(len(s) for s in tensor.string_data)
        else:
            total += count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return total


def external_data_files(model_file: Path) -> list[Path]:
    """The external data files ``model_file`` refers to (empty for a self-contained model)."""
    import onnx

    model = onnx.load(str(model_file), load_external_data=False)
    locations: set[str] = set()
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    locations.add(entry.value)
    return [model_file.parent / location for location in sorted(locations)]


def file_bytes(model_file: Path) -> int:
    """Size on disk of a model file plus the external data files it refers to."""
    files = [model_file, *external_data_files(model_file)]
    return sum(f.stat().st_size for f in files if f.exists())


def prune_unused_opsets(model: onnx.ModelProto) -> list[str]:
    """Drop opset imports of domains no node uses; return the dropped domains.

    onnxruntime's optimizer (run by ``quant_pre_process``) imports every domain it knows
    (``ai.onnx.training``, ``com.microsoft.nchwc``, ``org.pytorch.aten``...) whether used or not;
    other consumers of the file need not know those domains. The default domain always stays.
    """
    used = {node.domain for node in iter_nodes(model.graph)}
    for function in model.functions:
        used.add(function.domain)
        used.update(node.domain for node in function.node)
    imports = [(entry.domain, entry.version) for entry in model.opset_import]
    keep = [(domain, version) for domain, version in imports if domain in ("", "ai.onnx") or domain in used]
    dropped = sorted(domain for domain, version in imports if (domain, version) not in keep)
    if dropped:
        del model.opset_import[:]
        for domain, version in keep:
            entry = model.opset_import.add()
            entry.domain, entry.version = domain, version
    return dropped
