"""Which part of a split each node of an ONNX graph goes to (``split_model``).

A node is seeded with a part from its name: its transformer layer (``layers.<i>`` / ``layer.<i>``
in the name, ``/`` read as ``.``, as Olive's SplitModel reads module names), or the longest name
prefix listed in ``split_assignments``. Then, as Olive does: in graph order, a node takes the
highest part among its seed and its producers (a node never runs before what feeds it); nodes left
without one (before the first layer: masks, embeddings) go, in reverse order, to the lowest part of
their consumers. Constant nodes, and DequantizeLinear nodes of constant weights, are copied into
every part that consumes them rather than passed between parts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

LAYER_PATTERN = re.compile(r"(?:^|\.)layers?\.(\d+)(?:\.|$)")
_PASS_THROUGH = ("QuantizeLinear", "DequantizeLinear")


def dotted(name: str) -> str:
    return name.replace("/", ".").lstrip(".")


def layer_of(name: str) -> int | None:
    match = LAYER_PATTERN.search(dotted(name))
    return int(match.group(1)) if match else None


def assignment_of(name: str, assignments: dict[str, int]) -> int | None:
    """The part of the longest prefix of ``name`` (dotted) in ``assignments`` (Olive's rule)."""
    parts = dotted(name).split(".") if name else []
    while parts:
        key = ".".join(parts)
        if key in assignments:
            return assignments[key]
        parts.pop()
    return None


def _subgraph_names(graph: onnx.GraphProto) -> Iterator[str]:
    """Names a subgraph reads from the scopes around it."""
    defined = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
    for node in graph.node:
        for name in node_inputs(node):
            if name and name not in defined:
                yield name
        defined.update(node.output)
    for value in graph.output:
        if value.name not in defined:
            yield value.name


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """The node's inputs, then the outer names its subgraphs (If / Loop / Scan bodies) read."""
    names = list(node.input)
    for attribute in node.attribute:
        for graph in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
            names.extend(name for name in _subgraph_names(graph) if name not in names)
    return names


def is_constant_like(node: onnx.NodeProto, initializers: set[str]) -> bool:
    if node.op_type == "Constant":
        return True
    return node.op_type == "DequantizeLinear" and all(name in initializers or not name for name in node.input)


def assign_nodes(
    graph: onnx.GraphProto, seeds: list[int | None], head_part: bool
) -> list[set[int]]:  # long: the three sweeps share the maps
    """The parts of every node (a set: constants may be copied to several), from the seeds.
    ``head_part``: nodes that no seeded node feeds go to part 0 instead of their consumers' part."""
    initializers = {tensor.name for tensor in graph.initializer}
    nodes = list(graph.node)
    producer = {name: index for index, node in enumerate(nodes) for name in node.output if name}
    consumers: dict[int, list[int]] = {index: [] for index in range(len(nodes))}
    for index, node in enumerate(nodes):
        for name in node_inputs(node):
            if name in producer:
                consumers[producer[name]].append(index)
    constant = [is_constant_like(node, initializers) for node in nodes]
    parts: list[int | None] = [None] * len(nodes)
    for index, node in enumerate(nodes):
        if constant[index]:
            continue
        seed = None if node.op_type in _PASS_THROUGH and not LAYER_PATTERN.search(dotted(node.name)) else seeds[index]
        above = [parts[producer[name]] for name in node_inputs(node) if name in producer]
        known = [part for part in [seed, *above] if part is not None]
        parts[index] = max(known) if known else None
    for index in reversed(range(len(nodes))):
        if constant[index] or parts[index] is not None:
            continue
        below = [parts[child] for child in consumers[index] if parts[child] is not None]
        parts[index] = 0 if head_part or not below else min(p for p in below if p is not None)
    result: list[set[int]] = [set() if part is None else {part} for part in parts]
    for index in reversed(range(len(nodes))):  # a constant feeding a constant is placed after it
        if constant[index]:
            result[index] = set().union(*(result[child] for child in consumers[index])) or {0}
    return result


def chunk_layers(layers: list[int], num_splits: int) -> dict[int, int]:
    """Consecutive layers in ``num_splits`` groups of sizes differing by at most one (the larger
    first, as numpy.array_split and Olive's CaptureSplitInfo)."""
    if num_splits > len(layers):
        raise ValueError(f"num_splits={num_splits} but the model has {len(layers)} layers")
    size, extra = divmod(len(layers), num_splits)
    mapping: dict[int, int] = {}
    start = 0
    for part in range(num_splits):
        count = size + (1 if part < extra else 0)
        for layer in layers[start : start + count]:
            mapping[layer] = part
        start += count
    return mapping


def pack_units(unit_weights: list[dict[str, int]], budget: int, unit_names: list[str]) -> list[int]:
    """Consecutive units (layers) packed into parts whose weights (distinct initializers, in bytes)
    stay within ``budget``; the part of each unit. A unit over the budget alone is an error."""
    parts: list[int] = []
    part, held, used = 0, set(), 0
    for unit, weights in enumerate(unit_weights):
        alone = sum(weights.values())
        if alone > budget:
            raise ValueError(
                f"{unit_names[unit]} holds {alone} bytes of weights, more than max_part_bytes={budget}: no split fits it; "
                "raise max_part_bytes or quantize the model first"
            )
        extra = sum(size for name, size in weights.items() if name not in held)
        if unit and used + extra > budget:
            part, held, used = part + 1, set(), 0
            extra = alone
        held.update(weights)
        used += extra
        parts.append(part)
    return parts
