"""What the surgeons share: applying onnxscript rewrite rules with a count and, when nothing was
rewritten, the reason the closest match failed; reading constants; adding initializers and
nodes under names the graph does not use yet."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass, TopologicalSortPass
from onnxscript.rewriter import MatchingTracer, MatchResult, MatchStatus, RewriteRule, RewriteRuleSet

from passes.graph.surgeons.specs import Outcome, applied, not_applied


def apply_rules(model: ir.Model, rules: Sequence[RewriteRule], pattern: str, *, commute: bool = False) -> Outcome:
    """Apply ``rules`` to the whole model; when they rewrite nothing, say why: the failed
    condition of the closest match, else that ``pattern`` is not in the graph."""
    rule_set = RewriteRuleSet(list(rules), commute=commute)
    count = rule_set.apply_to_model(model)
    if count:
        return applied(count)
    tracer = MatchingTracer()  # a traced run only matches: it rewrites nothing
    rule_set.apply_to_model(model, tracer=tracer)
    reasons = [
        info.match_result.reason
        for matches in tracer.best_matches_map.values()
        for info in matches
        if info.status == MatchStatus.CONDITION_FAILED and info.match_result.reason
    ]
    if reasons:
        return not_applied(f"{pattern} found, but {reasons[0]}")
    return not_applied(f"no {pattern} in the graph")


def fail(reason: str) -> MatchResult:
    """A failed condition with its reason (what ``apply_rules`` reports)."""
    return MatchResult().fail(reason)


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The value's constant content (an initializer or a Constant node's output), else None."""
    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


def int_attr(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else int(attr.value)


def float_attr(node: ir.Node, name: str, default: float) -> float:
    attr = node.attributes.get(name)
    return default if attr is None else float(attr.value)


def used_names(graph: ir.Graph, node_names: bool = True) -> set[str]:
    """Names of the graph's values (and of its nodes unless ``node_names`` is false), subgraphs included."""
    names = set(graph.initializers) | {value.name for value in graph.inputs if value.name}
    for node in ir.traversal.RecursiveGraphIterator(graph):
        names.update(value.name for value in node.outputs if value.name)
        if node_names and node.name:
            names.add(node.name)
    return names


class Namer:
    """Fresh names for new values and nodes: ``base``, else ``base_1``, ``base_2``..."""

    def __init__(self, graph: ir.Graph) -> None:
        self.taken = used_names(graph)

    def __call__(self, base: str) -> str:
        name, suffix = base, 0
        while name in self.taken:
            suffix += 1
            name = f"{base}_{suffix}"
        self.taken.add(name)
        return name


def add_initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)))
    value.const_value = ir.tensor(array, name=name)
    graph.register_initializer(value)
    return value


def add_node(
    graph: ir.Graph, namer: Namer, op_type: str, inputs: Sequence[ir.Value | None], domain: str = "", **attributes: Any
) -> ir.Node:
    """Append a node named after its op type; its output is named ``<node>_output_0``."""
    name = namer(op_type)
    node = ir.node(op_type, inputs=list(inputs), attributes=attributes, domain=domain, name=name)
    node.outputs[0].name = namer(f"{name}_output_0")
    graph.append(node)
    return node


def all_graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """The graph and every subgraph in it (If branches, Loop and Scan bodies), depth first."""
    yield graph
    for node in graph:
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                yield from all_graphs(attr.value)
            elif attr.type == ir.AttributeType.GRAPHS:
                for subgraph in attr.value:
                    yield from all_graphs(subgraph)


def sort_and_prune(model: ir.Model) -> None:
    """Drop nodes and initializers nothing uses any more and restore topological order."""
    RemoveUnusedNodesPass()(model)
    TopologicalSortPass()(model)
