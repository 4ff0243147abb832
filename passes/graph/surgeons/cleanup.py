"""Cleanups after onnxruntime's tools: copies onnxruntime re-inserts itself (Memcpy nodes), and
two repairs of models onnx_ir cannot load as they are, so they work on the ModelProto: a tensor
produced by two nodes (onnxruntime's float16 converter writes such Casts), and an initializer
name given twice in a subgraph (onnxruntime's optimizer copies initializers into subgraphs)."""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import onnx_ir as ir
from onnx_ir.passes.common import TopologicalSortPass

from passes.graph.surgeons.ir_tools import all_graphs
from passes.graph.surgeons.specs import DeduplicateNodes, DeduplicateSubgraphInitializers, Outcome, RemoveMemcpy, applied, not_applied


def _subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """Every subgraph below ``graph`` (If branches, Loop and Scan bodies), depth first."""
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield sub
                yield from _subgraphs(sub)


def deduplicate_subgraph_initializers(model: onnx.ModelProto, spec: DeduplicateSubgraphInitializers) -> Outcome:
    removed, differing = 0, []
    for graph in _subgraphs(model.graph):
        first: dict[str, onnx.TensorProto] = {}
        kept = []
        for tensor in graph.initializer:
            if tensor.name not in first:
                first[tensor.name] = tensor
                kept.append(tensor)
                continue
            removed += 1
            if tensor.SerializeToString() != first[tensor.name].SerializeToString():
                differing.append(tensor.name)
        if len(kept) != len(graph.initializer):
            copies = [onnx.TensorProto.FromString(tensor.SerializeToString()) for tensor in kept]
            del graph.initializer[:]
            graph.initializer.extend(copies)
    if not removed:
        return not_applied("no subgraph repeats an initializer name")
    return applied(removed, f"kept the first of differing contents: {differing}" if differing else "")


def deduplicate_nodes(model: onnx.ModelProto, spec: DeduplicateNodes) -> Outcome:
    """Keep the first producer of each tensor name in the main graph; say when a removed node
    computed something else (different op, inputs or attributes) than the one kept."""
    producers: dict[str, onnx.NodeProto] = {}
    keep, differing = [], []
    for node in model.graph.node:
        clash = next((name for name in node.output if name and name in producers), None)
        if clash is None:
            producers.update({name: node for name in node.output if name})
            keep.append(node)
            continue
        first = producers[clash]
        same = (node.op_type, node.domain, list(node.input), list(node.output), list(node.attribute)) == (
            first.op_type,
            first.domain,
            list(first.input),
            list(first.output),
            list(first.attribute),
        )
        if not same:
            differing.append(node.name or clash)
    removed = len(model.graph.node) - len(keep)
    if not removed:
        return not_applied("no tensor is produced by two nodes")
    copies = [onnx.NodeProto.FromString(node.SerializeToString()) for node in keep]
    del model.graph.node[:]
    model.graph.node.extend(copies)
    return applied(removed, f"removed nodes that differed from the first producer: {differing}" if differing else "")


def remove_memcpy(model: ir.Model, spec: RemoveMemcpy) -> Outcome:
    removed = 0
    for graph in list(all_graphs(model.graph)):
        for node in list(graph):
            if node.op_type not in ("MemcpyToHost", "MemcpyFromHost") or len(node.inputs) != 1 or node.inputs[0] is None:
                continue
            source, copy = node.inputs[0], node.outputs[0]
            if copy.is_graph_output():
                if source.is_graph_input() or source.is_graph_output() or source.is_initializer():
                    continue  # the copy is the only thing that gives the output its own name
                name = copy.name
                source.type, source.shape = source.type or copy.type, source.shape or copy.shape
                copy.replace_all_uses_with(source, replace_graph_outputs=True)
                source.name = name  # the graph's output keeps its public name
            else:
                copy.replace_all_uses_with(source)
            graph.remove(node, safe=True)
            removed += 1
    if not removed:
        return not_applied("no MemcpyToHost or MemcpyFromHost node in the graph")
    TopologicalSortPass()(model)
    return applied(removed)
