"""Rewrites of onnxruntime-genai decoders (GroupQueryAttention, RotaryEmbedding, MatMulNBits)
for runtimes that need a simpler graph: one rotary cache, sequence lengths as inputs instead of
an attention mask, mask values that quantize, no identity g_idx."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from passes.graph.surgeons.ir_tools import all_graphs, const_array, int_attr, sort_and_prune
from passes.graph.surgeons.specs import (
    AttentionMaskToSequenceLengths,
    Outcome,
    RemoveGidxFromMatMulNBits,
    RemoveRopeMultiCache,
    ReplaceAttentionMaskValue,
    applied,
    not_applied,
)

#: where each op reads its cos and sin caches
_CACHE_INPUTS = {"GroupQueryAttention": (7, 8), "RotaryEmbedding": (2, 3)}


def _named_value(graph: ir.Graph, name: str) -> ir.Value | None:
    """The value called ``name`` in the graph or any subgraph (If branches hold both caches)."""
    for sub in all_graphs(graph):
        if name in sub.initializers:
            return sub.initializers[name]
        for node in sub:
            for value in node.outputs:
                if value.name == name:
                    return value
    return None


def remove_rope_multi_cache(model: ir.Model, spec: RemoveRopeMultiCache) -> Outcome:
    graph = model.graph
    consumer = next((node for node in graph if node.op_type in _CACHE_INPUTS), None)
    if consumer is None:
        return not_applied("no GroupQueryAttention or RotaryEmbedding in the graph")
    positions = _CACHE_INPUTS[consumer.op_type]
    if len(consumer.inputs) <= positions[1]:
        return not_applied(f"{consumer.name!r} takes no cos / sin cache inputs")
    caches = [consumer.inputs[index] for index in positions]
    producers = [None if cache is None else cache.producer() for cache in caches]
    if any(producer is None or producer.op_type != "If" for producer in producers):
        return not_applied(f"the cos / sin caches of {consumer.name!r} do not come from an If (one cache already)")
    size = "large" if spec.use_large_cache else "small"
    replacements = {}
    for key, cache in zip(("cos_cache", "sin_cache"), caches, strict=True):
        assert cache is not None
        source = _named_value(graph, f"{key}_{size}")
        array = const_array(source)
        if array is None:
            return not_applied(f"no constant {key}_{size} in the If's branches")
        replacements[cache] = ir.Value(
            name=f"{key}_single", shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype))
        )
        replacements[cache].const_value = ir.tensor(array, name=f"{key}_single")
        graph.register_initializer(replacements[cache])
    for cache, single in replacements.items():
        cache.replace_all_uses_with(single)
    sort_and_prune(model)  # the If, and the Greater that chose its branch, are unused now
    return applied(1, f"{size} caches kept")


def attention_mask_to_sequence_lengths(model: ir.Model, spec: AttentionMaskToSequenceLengths) -> Outcome:
    graph = model.graph
    attentions = [node for node in graph if node.op_type == "GroupQueryAttention"]
    if not attentions:
        return not_applied("no GroupQueryAttention in the graph")
    mask = next((value for value in graph.inputs if value.name == "attention_mask"), None)
    if mask is None:
        return not_applied("the graph has no attention_mask input")
    first = attentions[0]
    lengths = {"past_seq_len": first.inputs[5], "total_seq_len": first.inputs[6]}
    if any(value is None or value.is_graph_input() for value in lengths.values()):
        return not_applied("GroupQueryAttention's sequence lengths are graph inputs already")
    # every node the mask reaches must feed only this subgraph and GQA's length inputs
    reached, frontier = set(), [use.node for use in mask.uses()]
    while frontier:
        node = frontier.pop()
        if node in reached:
            continue
        reached.add(node)
        for value in node.outputs:
            if value.is_graph_output():
                return not_applied(f"the attention mask reaches the graph output {value.name!r}")
            for use in value.uses():
                if use.node.op_type == "GroupQueryAttention":
                    if use.idx not in (5, 6):
                        return not_applied(f"the attention mask feeds input {use.idx} of {use.node.name!r}, not its sequence lengths")
                else:
                    frontier.append(use.node)
    batch = mask.shape[0] if mask.shape is not None and len(mask.shape) else "batch_size"
    shapes = {"past_seq_len": [batch, 1], "total_seq_len": []}
    for name, value in lengths.items():
        assert value is not None
        new_input = ir.Value(name=name, shape=ir.Shape(shapes[name]), type=ir.TensorType(ir.DataType.INT32))
        graph.inputs.insert(0, new_input)
        value.replace_all_uses_with(new_input)
    graph.inputs.remove(mask)
    sort_and_prune(model)
    remaining = [use.node.name for use in mask.uses()]
    if remaining:
        raise ValueError(f"the attention mask is still read by {remaining}")
    return applied(1, f"{len(reached)} mask nodes removed")


_MASK_CONSUMERS = {"Add", "Mul", "Expand", "Where", "Shape"}


def _masked(array: np.ndarray, spec: ReplaceAttentionMaskValue) -> np.ndarray | None:
    if not np.any(array < spec.threshold):
        return None
    replaced = array.copy()
    replaced[replaced < spec.threshold] = spec.replacement
    return replaced


def replace_attention_mask_value(model: ir.Model, spec: ReplaceAttentionMaskValue) -> Outcome:
    """Only float32 values whose every consumer is a mask op (never a weight's MatMul)."""
    graph = model.graph
    count = 0
    for sub in all_graphs(graph):
        for node in sub:
            attr = node.attributes.get("value")
            if node.op_type not in ("Constant", "ConstantOfShape") or attr is None or attr.type != ir.AttributeType.TENSOR:
                continue
            if attr.value.dtype != ir.DataType.FLOAT or not all(use.node.op_type in _MASK_CONSUMERS for use in node.outputs[0].uses()):
                continue
            new = _masked(attr.value.numpy(), spec)
            if new is not None:
                node.attributes["value"] = ir.AttrTensor("value", ir.tensor(new))
                count += 1
        for value in sub.initializers.values():
            tensor = value.const_value
            if tensor is None or tensor.dtype != ir.DataType.FLOAT or not all(use.node.op_type in _MASK_CONSUMERS for use in value.uses()):
                continue
            new = _masked(tensor.numpy(), spec)
            if new is not None:
                value.const_value = ir.tensor(new, name=value.name)
                count += 1
    if not count:
        return not_applied(f"no float constant below {spec.threshold:g} feeds only {'/'.join(sorted(_MASK_CONSUMERS))} nodes")
    return applied(count)


def _identity_gidx(node: ir.Node, g_idx: np.ndarray) -> bool:
    k, block_size = int_attr(node, "K", -1), int_attr(node, "block_size", -1)
    if k <= 0 or block_size <= 0 or g_idx.size != k:
        return False
    return bool(np.array_equal(g_idx.ravel(), np.arange(k) // block_size))


def remove_gidx_from_matmul_nbits(model: ir.Model, spec: RemoveGidxFromMatMulNBits) -> Outcome:
    """MatMulNBits' inputs: A, B, scales, zero_points, g_idx (4), bias. The g_idx goes when
    channel i is in group i // block_size, the grouping MatMulNBits uses without one."""
    count, kept = 0, 0
    for node in model.graph:
        if node.op_type != "MatMulNBits" or len(node.inputs) < 5 or node.inputs[4] is None:
            continue
        g_idx = const_array(node.inputs[4])
        if g_idx is None or not _identity_gidx(node, g_idx):
            kept += 1
            continue
        if len(node.inputs) > 5:
            node.replace_input_with(4, None)  # a bias follows: g_idx becomes an omitted input
        else:
            node.resize_inputs(4)
        count += 1
    if not count:
        reason = f"{kept} g_idx inputs are not the identity grouping" if kept else "no MatMulNBits with a g_idx input"
        return not_applied(reason)
    sort_and_prune(model)
    return applied(count, f"{kept} non-identity g_idx kept" if kept else "")
