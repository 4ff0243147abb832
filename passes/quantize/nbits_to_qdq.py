"""MatMulNBits back to standard ONNX: Olive's ``MatMulNBitsToQDQ`` with its options. Every
``com.microsoft:MatMulNBits`` with constant weights becomes DequantizeLinear (blocked along K with
the node's block size, int4/uint4 or int8/uint8, its zero points per output column and block when
it has them) -> MatMul (-> Add for a bias). NPU execution providers (QNN, VitisAI, OpenVINO's NPU)
take QDQ models and not onnxruntime's contrib ops; the dequantized weights are exactly the ones
MatMulNBits computes with, so outputs match up to float summation order. (onnxruntime's CPU EP
fuses DequantizeLinear + MatMul back into MatMulNBits with int8 activations unless the session sets
``session.qdq_matmulnbits_accuracy_level``: about 1% off on a small MLP; the graph itself is exact.)

Blocked DequantizeLinear needs opset 21: the model's default-domain opset is raised to 21 when it
is lower (as Olive does). Left as they were, and listed in the details with the reason: nodes
in ``nodes_to_exclude``, nodes whose weights are not constants, float zero points (hqq's), a
non-trivial ``g_idx`` and bit widths other than 4 and 8. Only the main graph is rewritten.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from engine.core import ModelArtifact, PassContext, PassResult
from passes.common.external_data import ExternalDataOptions, save_with_options
from passes.common.graph_tools import op_delta, qualified_op_counts
from passes.common.onnx_io import OnnxPass
from passes.common.pass_io import onnx_output
from passes.quantize._qdq_pack import DqLayout, quantized_tensor, scale_tensor, weight_tensor, zero_points

CONTRIB = "com.microsoft"
QDQ_OPSET = 21  # blocked DequantizeLinear and int4 types


class NbitsToQdq(OnnxPass):
    name = "nbits_to_qdq"
    summary = "Turn MatMulNBits nodes into DequantizeLinear + MatMul (Olive's MatMulNBitsToQDQ), for NPU execution providers."
    version = "1"
    accepts = ("onnx", "genai")
    produces = "onnx"
    keeps = ("genai",)
    libraries = ("onnx", "numpy")

    class Config(ExternalDataOptions):
        use_transpose_op: bool = Field(
            False,
            description="Store the weight [N, K] and Transpose after the DequantizeLinear (some EPs, e.g. DirectML, prefer it); false: store it [K, N].",
        )
        use_int4: bool = Field(
            False, description="Signed int4 weights for 4-bit nodes (Olive's older name for use_signed_int); false: uint4."
        )
        use_signed_int: bool = Field(False, description="Signed weights (int4 / int8) for every node; false: unsigned (uint4 / uint8).")
        add_zero_point: bool = Field(
            False,
            description="Write zero points even where they are DequantizeLinear's default (symmetric weights stored signed); false: leave them out there.",
        )
        nodes_to_exclude: list[str] | None = Field(None, description="MatMulNBits nodes (by name) to leave as they are.")

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        import onnx

        proto = onnx.load(str(model.model_file))  # external data is read in too
        counts_in = qualified_op_counts(proto)
        converted, skipped = convert(proto, self.config)
        save_with_options(proto, Path(ctx.output_dir), self.config)
        counts_out = qualified_op_counts(proto)
        details = {
            "converted": converted,
            "skipped": skipped,
            "opset": next((entry.version for entry in proto.opset_import if entry.domain in ("", "ai.onnx")), None),
            "op_delta": op_delta(counts_in, counts_out),
        }
        notes = [f"{len(skipped)} MatMulNBits node(s) left as they were (see details.skipped)"] if skipped else []
        if not converted and not skipped:
            notes.append("the model has no MatMulNBits node")
        return onnx_output(model, ctx, details, notes)


def convert(proto: Any, cfg: NbitsToQdq.Config) -> tuple[int, dict[str, str]]:
    """Rewrite ``proto``'s MatMulNBits nodes in place: (how many, {node: why left} for the others)."""
    from onnx import numpy_helper

    graph = proto.graph
    constants = {tensor.name: tensor for tensor in graph.initializer}
    excluded = set(cfg.nodes_to_exclude or [])
    names = {node.name for node in graph.node if node.name}
    new_nodes: list[Any] = []
    skipped: dict[str, str] = {}
    converted = 0
    for index, node in enumerate(graph.node):
        if node.op_type != "MatMulNBits" or node.domain != CONTRIB:
            new_nodes.append(node)
            continue
        key = node.name or f"#{index}"
        reason = "in nodes_to_exclude" if node.name in excluded else _unsupported(node, constants)
        if reason:
            skipped[key] = reason
            new_nodes.append(node)
            continue
        arrays = {i: numpy_helper.to_array(constants[name]) for i, name in enumerate(node.input) if i > 0 and name}
        replacement, initializers = _replace(node, arrays, cfg, names)
        new_nodes.extend(replacement)
        graph.initializer.extend(initializers)
        converted += 1
    if converted:
        del graph.node[:]
        graph.node.extend(new_nodes)
        _drop_unused(graph)
        _set_opsets(proto)
    return converted, skipped


def _attributes(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}


def _unsupported(node: Any, constants: dict[str, Any]) -> str | None:
    """Why ``node`` cannot become DQ + MatMul, or None."""
    from onnx import TensorProto, numpy_helper

    inputs = list(node.input)
    attributes = _attributes(node)
    if attributes.get("bits", 4) not in (4, 8):
        return f"{attributes.get('bits')} bits (4 and 8 are converted)"
    if any(name and name not in constants for name in inputs[1:]):
        return "weights, scales, zero points or bias are not constant initializers"
    if len(inputs) > 3 and inputs[3] and constants[inputs[3]].data_type != TensorProto.UINT8:
        return "float zero points (DequantizeLinear takes integer zero points)"
    if len(inputs) > 4 and inputs[4]:
        k, block_size = int(attributes["K"]), int(attributes["block_size"])
        g_idx = numpy_helper.to_array(constants[inputs[4]])
        if not np.array_equal(g_idx.reshape(-1), np.arange(k, dtype=np.int64) // block_size):
            return "a non-trivial g_idx (DequantizeLinear blocks are contiguous)"
    return None


def new_name(names: set[str], old: str, op_type: str) -> str:
    """Olive's naming: MatMulNBits / MatMul_Q4 / MatMul_Q8 in the old name replaced by ``op_type``
    (else ``<old>_<op_type>``), made unique with a counter."""
    base = next(
        (old.replace(part, op_type) for part in ("MatMulNBits", "MatMul_Q4", "MatMul_Q8") if old and part in old), f"{old}_{op_type}"
    )
    name, counter = base, 0
    while name in names:
        name, counter = f"{base}_{counter}", counter + 1
    names.add(name)
    return name


def _replace(node: Any, arrays: dict[int, np.ndarray], cfg: NbitsToQdq.Config, names: set[str]) -> tuple[list[Any], list[Any]]:
    """The nodes and initializers that replace one MatMulNBits; its output keeps its name."""
    from onnx import helper

    attributes = _attributes(node)
    bits = int(attributes.get("bits", 4))
    layout = DqLayout(
        k=int(attributes["K"]),
        n=int(attributes["N"]),
        bits=bits,
        block_size=int(attributes["block_size"]),
        signed=cfg.use_signed_int or (bits == 4 and cfg.use_int4),
        transposed=cfg.use_transpose_op,
    )
    dq_name = new_name(names, node.name, "DequantizeLinear")
    initializers = [weight_tensor(f"{dq_name}.qweight", arrays[1], layout), scale_tensor(f"{dq_name}.scales", arrays[2], layout)]
    zeros = zero_points(arrays.get(3), layout)
    # DequantizeLinear's default zero point is 0: leave it out where that is what the node has
    if cfg.add_zero_point or not (layout.signed and np.all(zeros == layout.midpoint)):
        initializers.append(quantized_tensor(f"{dq_name}.qzeros", zeros, layout))
    dq_attributes: dict[str, Any] = {"axis": layout.axis}
    if not layout.per_axis:
        dq_attributes["block_size"] = layout.block_size
    dq_out = f"{dq_name}/output_0"
    nodes = [helper.make_node("DequantizeLinear", [t.name for t in initializers], [dq_out], name=dq_name, **dq_attributes)]
    weight = dq_out
    if layout.transposed:
        transpose_name = new_name(names, node.name, "Transpose")
        weight = f"{transpose_name}/output_0"
        nodes.append(helper.make_node("Transpose", [dq_out], [weight], name=transpose_name, perm=[1, 0]))
    matmul_name = new_name(names, node.name, "MatMul")
    has_bias = 5 in arrays
    matmul_out = f"{matmul_name}/output_0" if has_bias else node.output[0]
    nodes.append(helper.make_node("MatMul", [node.input[0], weight], [matmul_out], name=matmul_name))
    if has_bias:
        from onnx import numpy_helper

        bias = numpy_helper.from_array(arrays[5].reshape(layout.n), f"{matmul_name}.bias")
        initializers.append(bias)
        add_name = new_name(names, node.name, "Add")
        nodes.append(helper.make_node("Add", [matmul_out, bias.name], [node.output[0]], name=add_name))
    return nodes, initializers


def _drop_unused(graph: Any) -> None:
    """Remove initializers no node (or subgraph) reads and no graph output names."""
    used = {name for node in graph.node for name in node.input} | {output.name for output in graph.output}
    for node in graph.node:
        for attribute in node.attribute:
            for subgraph in [attribute.g, *attribute.graphs]:
                used.update(name for inner in subgraph.node for name in inner.input)
    kept = [tensor for tensor in graph.initializer if tensor.name in used]
    if len(kept) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)


def _set_opsets(proto: Any) -> None:
    """Default-domain opset at least 21; com.microsoft dropped when no node uses it any more."""
    from onnx import helper

    entries = list(proto.opset_import)
    default = next((entry for entry in entries if entry.domain in ("", "ai.onnx")), None)
    if default is None:
        proto.opset_import.append(helper.make_opsetid("", QDQ_OPSET))
    elif default.version < QDQ_OPSET:
        default.version = QDQ_OPSET
    if not any(node.domain == CONTRIB for node in proto.graph.node):
        kept = [entry for entry in proto.opset_import if entry.domain != CONTRIB]
        del proto.opset_import[:]
        proto.opset_import.extend(kept)
