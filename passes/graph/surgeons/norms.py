"""Normalizations rewritten as LpNormalization (p = 2, last axis).

RMSNorm(x) * w = x / sqrt(mean(x^2) + eps) * w = LpNorm(x) * (w * sqrt(N)) for N = the hidden
size, exactly when eps = 0 and up to eps / mean(x^2) otherwise; x / sum(x^2) ** 0.5 over the
last axis is LpNormalization by definition."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import RewriteRule

from passes.graph.surgeons.ir_tools import Namer, add_initializer, add_node, apply_rules, const_array, fail, int_attr, sort_and_prune
from passes.graph.surgeons.specs import Outcome, PowReduceSumPowDiv2LpNorm, SimplifiedLayerNormToL2Norm, applied, not_applied

_LAYER_NORMS = {("", "SimplifiedLayerNormalization"): 2, ("com.microsoft", "SkipSimplifiedLayerNormalization"): 3}


def _why_not(node: ir.Node, graph: ir.Graph) -> str | None:
    """Why this (Skip)SimplifiedLayerNormalization cannot become an L2 norm, or None."""
    if len(node.inputs) != _LAYER_NORMS[(node.domain, node.op_type)]:
        return f"{node.name!r} has {len(node.inputs)} inputs (a bias is not supported)"
    if node.op_type == "SimplifiedLayerNormalization":
        if int_attr(node, "axis", -1) != -1:
            return f"{node.name!r} normalizes over axis {int_attr(node, 'axis', -1)}, not the last"
        if any(value.uses() for value in node.outputs[1:]):
            return f"{node.name!r} has its mean / inv_std_var outputs in use"
    elif any(value.uses() or value.is_graph_output() for value in node.outputs[1:3]):
        return f"{node.name!r} has its mean / inv_std_var outputs in use"
    weight = const_array(node.inputs[-1])
    if weight is None or weight.ndim != 1:
        return f"{node.name!r} has no constant 1D weight"
    return None


def simplified_layer_norm_to_l2_norm(model: ir.Model, spec: SimplifiedLayerNormToL2Norm) -> Outcome:
    graph = model.graph
    namer = Namer(graph)
    scaled: dict[int, ir.Value] = {}  # id of a weight value -> its sqrt(N)-scaled initializer (weights may be shared)
    count, reasons = 0, []
    for node in list(graph):
        if (node.domain, node.op_type) not in _LAYER_NORMS:
            continue
        reason = _why_not(node, graph)
        if reason:
            reasons.append(reason)
            continue
        weight_value = node.inputs[-1]
        assert weight_value is not None
        if id(weight_value) not in scaled:
            weight = const_array(weight_value)
            assert weight is not None
            root_n = np.sqrt(weight.shape[-1]).astype(weight.dtype)
            # all-ones weights (rotated QuaRot / SpinQuant models): one scalar multiplier
            new_weight = np.array([root_n], weight.dtype) if np.all(weight == 1) else weight * root_n
            scaled[id(weight_value)] = add_initializer(graph, namer(f"{weight_value.name}_l2norm"), new_weight)
        source = node.inputs[0]
        if node.op_type == "SkipSimplifiedLayerNormalization":
            add = add_node(graph, namer, "Add", node.inputs[:2])
            source = add.outputs[0]
            if len(node.outputs) > 3:
                add.outputs[0].shape, add.outputs[0].type = node.outputs[3].shape, node.outputs[3].type
                node.outputs[3].replace_all_uses_with(add.outputs[0], replace_graph_outputs=True)
        norm = add_node(graph, namer, "LpNormalization", [source], axis=-1, p=2)
        mul = add_node(graph, namer, "Mul", [norm.outputs[0], scaled[id(weight_value)]])
        mul.outputs[0].shape, mul.outputs[0].type = node.outputs[0].shape, node.outputs[0].type
        node.outputs[0].replace_all_uses_with(mul.outputs[0], replace_graph_outputs=True)
        count += 1
    if not count:
        return not_applied(reasons[0] if reasons else "no SimplifiedLayerNormalization or SkipSimplifiedLayerNormalization in the graph")
    sort_and_prune(model)
    return applied(count, f"{len(reasons)} left: {reasons[0]}" if reasons else "")


def _last_axis_sum(context: Any, x: ir.Value, s: ir.Value, two: ir.Value, half: ir.Value, **_: Any) -> Any:
    two_array, half_array = const_array(two), const_array(half)
    if two_array is None or two_array.size != 1 or float(two_array.item()) != 2.0:
        return fail("the inner Pow's exponent is not the constant 2")
    if half_array is None or half_array.size != 1 or float(half_array.item()) != 0.5:
        return fail("the outer Pow's exponent is not the constant 0.5")
    reduce = s.producer()
    assert reduce is not None
    if int_attr(reduce, "keepdims", 1) != 1:
        return fail("the ReduceSum drops the reduced axis (keepdims = 0)")
    if len(reduce.inputs) > 1:
        axes = const_array(reduce.inputs[1])
    else:
        attr = reduce.attributes.get("axes")
        axes = None if attr is None else np.array(attr.value)
    rank = None if x.shape is None else len(x.shape)
    if axes is None or axes.size != 1 or int(axes.item()) not in (-1, rank - 1 if rank is not None else -1):
        return fail("the ReduceSum does not reduce the last axis alone")
    return True


def pow_reduce_sum_pow_div_to_lp_norm(model: ir.Model, spec: PowReduceSumPowDiv2LpNorm) -> Outcome:
    def with_axes_input(op: Any, x: ir.Value, two: ir.Value, axes: ir.Value, half: ir.Value) -> ir.Value:
        return op.Div(x, op.Pow(op.ReduceSum(op.Pow(x, two), axes, _allow_other_attributes=True, _outputs=["s"]), half))

    def with_axes_attribute(op: Any, x: ir.Value, two: ir.Value, half: ir.Value) -> ir.Value:
        return op.Div(x, op.Pow(op.ReduceSum(op.Pow(x, two), _allow_other_attributes=True, _outputs=["s"]), half))

    def replacement(op: Any, x: ir.Value, **_: Any) -> ir.Value:
        return op.LpNormalization(x, axis=-1, p=2)

    rules = [
        RewriteRule(with_axes_input, replacement, _last_axis_sum, name="PowReduceSumPowDiv2LpNorm"),
        RewriteRule(with_axes_attribute, replacement, _last_axis_sum, name="PowReduceSumPowDiv2LpNormAttr"),
    ]
    return apply_rules(model, rules, "x / ReduceSum(x ** 2) ** 0.5")
