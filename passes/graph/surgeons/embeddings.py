"""The embedding table and the LM head: tie them (one weight for both), quantize the table to
INT8 blocks, and let the INT8 LM head read the quantized table."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from passes.graph.surgeons.ir_tools import Namer, add_initializer, add_node, const_array, int_attr, sort_and_prune
from passes.graph.surgeons.specs import Outcome, QuantizeEmbeddingInt8, ShareEmbeddingLmHead, TieWordEmbeddings, applied, not_applied

MSFT = "com.microsoft"
_TOKEN_INPUTS = ("input_ids", "input_embeds", "inputs_embeds")
_BLOCK = 32


def _embedding_and_head(graph: ir.Graph) -> tuple[ir.Node, ir.Node] | str:
    tokens = next((value for value in graph.inputs if value.name in _TOKEN_INPUTS), None)
    logits = next((value for value in graph.outputs if value.name == "logits"), None)
    if tokens is None or logits is None:
        return "the graph has no input_ids (or inputs_embeds) input and logits output"
    embedding = next(
        (
            u.node
            for u in tokens.uses()
            if u.node.op_type in ("Gather", "GatherBlockQuantized") and u.idx == 1 and const_array(u.node.inputs[0]) is not None
        ),
        None,
    )
    head = logits.producer()
    if embedding is None or head is None or head.op_type not in ("MatMul", "MatMulNBits") or const_array(head.inputs[1]) is None:
        return "no Gather of a constant table on the tokens and MatMul (or MatMulNBits) of a constant weight producing logits"
    return embedding, head


def tie_word_embeddings(model: ir.Model, spec: TieWordEmbeddings) -> Outcome:
    found = _embedding_and_head(model.graph)
    if isinstance(found, str):
        return not_applied(found)
    embedding, head = found
    kinds = (embedding.op_type, head.op_type)
    if kinds == ("Gather", "MatMul"):
        return _tie_float(model, embedding, head)
    if kinds == ("GatherBlockQuantized", "MatMulNBits"):
        return _tie_quantized(model, embedding, head)
    return not_applied(f"the embedding is a {kinds[0]} and the LM head a {kinds[1]}: one is quantized and the other is not")


def _tie_float(model: ir.Model, embedding: ir.Node, head: ir.Node) -> Outcome:
    """logits = x @ W.T with W the [vocab, hidden] table: Gemm(transB) on 2D rows, reshaped back."""
    graph, namer = model.graph, Namer(model.graph)
    table, weight = const_array(embedding.inputs[0]), const_array(head.inputs[1])
    assert table is not None and weight is not None
    if table.ndim != 2 or table.T.shape != weight.shape or not np.array_equal(table.T, weight):
        return not_applied("the LM head's weight is not the transposed embedding table (weights differ)")
    if model.opset_imports.get("", 0) < 15:
        return not_applied("the model's opset is below 15 (Shape with an end attribute)")
    vocab, hidden = table.shape
    x, logits = head.inputs[0], head.outputs[0]
    rows = add_node(graph, namer, "Reshape", [x, add_initializer(graph, namer("tied_rows_shape"), np.array([-1, hidden], np.int64))])
    gemm = add_node(graph, namer, "Gemm", [rows.outputs[0], embedding.inputs[0]], transB=1)
    shape = add_node(graph, namer, "Shape", [x], end=-1)
    out_shape = add_node(
        graph, namer, "Concat", [shape.outputs[0], add_initializer(graph, namer("tied_vocab"), np.array([vocab], np.int64))], axis=0
    )
    restored = add_node(graph, namer, "Reshape", [gemm.outputs[0], out_shape.outputs[0]])
    new = restored.outputs[0]
    new.type, new.shape = logits.type, logits.shape
    name = logits.name
    logits.replace_all_uses_with(new, replace_graph_outputs=True)
    logits.name = None
    new.name = name
    sort_and_prune(model)
    return applied(1, f"LM head reads {embedding.inputs[0].name!r}")


def _tie_quantized(model: ir.Model, embedding: ir.Node, head: ir.Node) -> Outcome:
    """GatherBlockQuantized(data, indices, scales, zero_points) and MatMulNBits(A, B, scales,
    zero_points): equal quantized tensors -> the head reads the embedding's (B reshaped to 3D)."""
    graph, namer = model.graph, Namer(model.graph)
    table_inputs = [embedding.inputs[0], *embedding.inputs[2:]]
    head_inputs = list(head.inputs[1 : 1 + len(table_inputs)])
    if len(head.inputs) - 1 < len(table_inputs):
        return not_applied("the LM head has fewer quantization inputs than the embedding")
    for mine, theirs in zip(table_inputs, head_inputs, strict=True):
        a, b = const_array(mine), const_array(theirs)
        if a is None or b is None or a.size != b.size or not np.array_equal(a.ravel(), b.ravel()):
            return not_applied("the LM head's quantized weight, scales or zero points differ from the embedding's")
    for index, value in enumerate(table_inputs[1:], start=2):
        head.replace_input_with(index, value)
    b = head.inputs[1]
    assert b is not None and b.shape is not None and table_inputs[0] is not None
    shape = add_initializer(graph, namer("tied_weight_shape"), np.array(list(b.shape), np.int64))
    head.replace_input_with(1, add_node(graph, namer, "Reshape", [table_inputs[0], shape]).outputs[0])
    sort_and_prune(model)
    return applied(1, f"LM head reads {table_inputs[0].name!r}")


def _embedding_gather(graph: ir.Graph, op_type: str) -> ir.Node | None:
    """The token embedding: a node named embed_tokens, else one gathering rows of input_ids."""
    candidates = [node for node in graph if node.op_type == op_type]
    named = [node for node in candidates if "embed_tokens" in (node.name or "")]
    if named:
        return named[0]
    return next((node for node in candidates if node.inputs[1] is not None and node.inputs[1].name == "input_ids"), None)


def quantize_embedding_int8(model: ir.Model, spec: QuantizeEmbeddingInt8) -> Outcome:
    graph, namer = model.graph, Namer(model.graph)
    gather = _embedding_gather(graph, "Gather")
    if gather is None:
        return not_applied("no embed_tokens Gather (nor a Gather of input_ids) in the graph")
    table_value = gather.inputs[0]
    table = const_array(table_value)
    if table is None or table.dtype not in (np.float16, np.float32) or table.ndim != 2 or int_attr(gather, "axis", 0) != 0:
        return not_applied(f"{gather.name!r} does not gather rows of a constant FP16/FP32 2D table")
    vocab, hidden = table.shape
    if hidden % _BLOCK:
        return not_applied(f"the hidden size {hidden} is not a multiple of the block size {_BLOCK}")
    blocks = table.astype(np.float32).reshape(vocab, hidden // _BLOCK, _BLOCK)
    scales = (np.abs(blocks).max(axis=2) / 127.0).astype(table.dtype)
    divisor = np.where(scales == 0, 1.0, scales.astype(np.float32))
    quantized = (np.clip(np.round(blocks / divisor[:, :, None]), -128, 127).astype(np.int16) + 128).astype(np.uint8)
    base = table_value.name if table_value is not None and table_value.name else "embed_tokens"
    inputs = [
        add_initializer(graph, namer(f"{base}_Q8"), quantized.reshape(vocab, hidden)),
        gather.inputs[1],
        add_initializer(graph, namer(f"{base}_scales"), scales),
        add_initializer(graph, namer(f"{base}_zp"), np.full((vocab, hidden // _BLOCK), 128, np.uint8)),
    ]
    model.opset_imports[MSFT] = max(model.opset_imports.get(MSFT, 0), 1)
    node = add_node(graph, namer, "GatherBlockQuantized", inputs, domain=MSFT, bits=8, block_size=_BLOCK, gather_axis=0, quantize_axis=1)
    node.outputs[0].type, node.outputs[0].shape = gather.outputs[0].type, gather.outputs[0].shape
    gather.outputs[0].replace_all_uses_with(node.outputs[0], replace_graph_outputs=True)
    sort_and_prune(model)
    return applied(1, f"{vocab}x{hidden} table in INT8 blocks of {_BLOCK}")


def share_embedding_lm_head(model: ir.Model, spec: ShareEmbeddingLmHead) -> Outcome:
    """The LM head becomes an 8-bit MatMulNBits over the embedding's INT8 table: right for a
    model whose LM head is tied to its embedding (the table is then the head's weight)."""
    graph, namer = model.graph, Namer(model.graph)
    table_node = _embedding_gather(graph, "GatherBlockQuantized")
    if table_node is None or int_attr(table_node, "bits", 4) != 8:
        return not_applied("no INT8 embed_tokens GatherBlockQuantized (run QuantizeEmbeddingInt8 first)")
    head = next((node for node in graph if node.op_type == "MatMulNBits" and "lm_head" in (node.name or "")), None)
    if head is None:
        return not_applied("no lm_head MatMulNBits in the graph")
    table_value, scales = table_node.inputs[0], table_node.inputs[2]
    table = const_array(table_value)
    assert table is not None and table_value is not None
    vocab, hidden = table.shape
    block = int_attr(table_node, "block_size", _BLOCK)
    if head.inputs[2] is scales:
        return not_applied("the LM head reads the embedding's table already")
    if (int_attr(head, "N", -1), int_attr(head, "K", -1)) != (vocab, hidden):
        return not_applied(f"the LM head is {int_attr(head, 'K', -1)} -> {int_attr(head, 'N', -1)}, the table {vocab} x {hidden}")
    shape = add_initializer(graph, namer("lm_head_shared_weight_shape"), np.array([vocab, hidden // block, block], np.int64))
    weight = add_node(graph, namer, "Reshape", [table_value, shape]).outputs[0]
    inputs = [head.inputs[0], weight, scales, *table_node.inputs[3:4]]
    attributes = {"bits": 8, "block_size": block, "K": hidden, "N": vocab}
    if "accuracy_level" in head.attributes:
        attributes["accuracy_level"] = int_attr(head, "accuracy_level", 0)
    shared = add_node(graph, namer, "MatMulNBits", inputs, domain=MSFT, **attributes)
    old = head.outputs[0]
    shared.outputs[0].type, shared.outputs[0].shape = old.type, old.shape
    name = old.name
    old.replace_all_uses_with(shared.outputs[0], replace_graph_outputs=True)
    old.name = None
    shared.outputs[0].name = name
    sort_and_prune(model)
    return applied(1, f"lm_head reads {table_value.name!r}")
