"""Rewrites between Gemm and MatMul + Add, and Reciprocal * a -> Div. Each holds exactly:
Gemm(A, B, C) = A @ B + C when alpha = beta = 1 and transA = 0 (B transposed when transB), and
C broadcasts the same way to both; a / x = a * (1 / x) up to the rounding of the reciprocal."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass
from onnxscript.rewriter import RewriteRule

from passes.graph.surgeons.ir_tools import Namer, apply_rules, const_array, fail, float_attr, int_attr
from passes.graph.surgeons.specs import GemmToMatMulAdd, MatMulAddToGemm, Outcome, ReciprocalMulToDiv


def gemm_to_matmul_add(model: ir.Model, spec: GemmToMatMulAdd) -> Outcome:
    namer = Namer(model.graph)

    def with_bias(op: Any, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        return op.Gemm(a, b, c, _allow_other_attributes=True, _outputs=["y"])

    def without_bias(op: Any, a: ir.Value, b: ir.Value) -> ir.Value:
        return op.Gemm(a, b, _allow_other_attributes=True, _outputs=["y"])

    def condition(context: Any, y: ir.Value, **_: Any) -> Any:
        gemm = y.producer()
        assert gemm is not None
        if float_attr(gemm, "alpha", 1.0) != 1.0 or (len(gemm.inputs) > 2 and float_attr(gemm, "beta", 1.0) != 1.0):
            return fail(f"Gemm {gemm.name!r} scales by alpha or beta (only alpha = beta = 1 is a plain MatMul + Add)")
        if int_attr(gemm, "transA", 0):
            return fail(f"Gemm {gemm.name!r} transposes A (transA = 1)")
        return True

    def weight(op: Any, b: ir.Value, y: ir.Value) -> ir.Value:
        gemm = y.producer()
        assert gemm is not None
        if not int_attr(gemm, "transB", 0):
            return b
        array = const_array(b)
        if array is None:
            return op.Transpose(b, perm=[1, 0])
        # a new initializer: the transposed one may be shared with other nodes
        name = namer(f"{b.name}_transposed")
        return op.initializer(ir.tensor(np.ascontiguousarray(array.T), name=name), name=name)

    def replace_with_bias(op: Any, a: ir.Value, b: ir.Value, c: ir.Value, y: ir.Value) -> ir.Value:
        return op.Add(op.MatMul(a, weight(op, b, y)), c)

    def replace_without_bias(op: Any, a: ir.Value, b: ir.Value, y: ir.Value) -> ir.Value:
        return op.MatMul(a, weight(op, b, y))

    rules = [
        RewriteRule(with_bias, replace_with_bias, condition, name="GemmToMatMulAdd"),
        RewriteRule(without_bias, replace_without_bias, condition, name="GemmToMatMul"),
    ]
    return apply_rules(model, rules, "Gemm")


def _dims(value: ir.Value) -> list[Any] | None:
    return None if value.shape is None else list(value.shape)


def _gemm_plan(a: ir.Value, b: ir.Value, c: ir.Value) -> Any:
    """(reshape needed, rows, N) when MatMul(a, b) + c can be a Gemm, else a failed match."""
    dims_a, dims_b, dims_c = _dims(a), _dims(b), _dims(c)
    if dims_b is None or len(dims_b) != 2:
        return fail(f"the MatMul's second input {b.name!r} is not known to be 2D")
    if dims_c is None or len(dims_c) != 1:
        return fail(f"the Add's other input {c.name!r} is not known to be 1D (a bias)")
    if dims_a is None or len(dims_a) < 2:
        return fail(f"the MatMul's first input {a.name!r} has no known rank of 2 or more")
    if len(dims_a) == 2:
        return False, None, dims_b[1]
    if not all(isinstance(dim, int) for dim in [*dims_a, *dims_b]):
        return fail(
            f"the MatMul's first input {a.name!r} is {len(dims_a)}D with a dynamic shape (Gemm needs 2D; reshaping needs static dims)"
        )
    return True, math.prod(dims_a[:-1]), dims_b[1]


def _shape(op: Any, namer: Namer, base: str, dims: list[int]) -> ir.Value:
    name = namer(base)
    return op.initializer(ir.tensor(np.array(dims, np.int64), name=name), name=name)


def _flatten(op: Any, namer: Namer, a: ir.Value, rows: int) -> ir.Value:
    dims = _dims(a)
    assert dims is not None
    return op.Reshape(a, _shape(op, namer, "gemm_rows_shape", [rows, dims[-1]]))


def _restore(op: Any, namer: Namer, value: ir.Value, a: ir.Value, n: int) -> ir.Value:
    dims = _dims(a)
    assert dims is not None
    return op.Reshape(value, _shape(op, namer, "gemm_output_shape", [*dims[:-1], n]))


def matmul_add_to_gemm(model: ir.Model, spec: MatMulAddToGemm) -> Outcome:
    ShapeInferencePass()(model)  # leaves the model unchanged (with a warning) when onnx cannot infer it
    namer = Namer(model.graph)

    def plain(op: Any, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        return op.Add(op.MatMul(a, b), c, _outputs=["y"])

    def with_relu(op: Any, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        return op.Relu(op.Add(op.MatMul(a, b), c))

    def plain_condition(context: Any, a: ir.Value, b: ir.Value, c: ir.Value, y: ir.Value) -> Any:
        plan = _gemm_plan(a, b, c)
        if not isinstance(plan, tuple):
            return plan
        users = [use.node for use in y.uses()]
        if plan[0] and len(users) == 1 and users[0].op_type == "Relu" and not y.is_graph_output():
            return fail("the Add feeds a Relu: the Relu form reshapes after it")
        return True

    def relu_condition(context: Any, a: ir.Value, b: ir.Value, c: ir.Value) -> Any:
        plan = _gemm_plan(a, b, c)
        return plan if not isinstance(plan, tuple) else plan[0]

    def replace_plain(op: Any, a: ir.Value, b: ir.Value, c: ir.Value, **_: Any) -> ir.Value:
        reshape, rows, n = _gemm_plan(a, b, c)
        if not reshape:
            return op.Gemm(a, b, c)
        return _restore(op, namer, op.Gemm(_flatten(op, namer, a, rows), b, c), a, n)

    def replace_relu(op: Any, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        _, rows, n = _gemm_plan(a, b, c)
        return _restore(op, namer, op.Relu(op.Gemm(_flatten(op, namer, a, rows), b, c)), a, n)

    rules = [
        RewriteRule(plain, replace_plain, plain_condition, name="MatMulAddToGemm"),
        RewriteRule(with_relu, replace_relu, relu_condition, name="MatMulAddReluToGemmRelu"),
    ]
    return apply_rules(model, rules, "MatMul followed by Add", commute=True)


def reciprocal_mul_to_div(model: ir.Model, spec: ReciprocalMulToDiv) -> Outcome:
    def pattern(op: Any, x: ir.Value, a: ir.Value) -> ir.Value:
        return op.Mul(a, op.Reciprocal(x))

    def replacement(op: Any, x: ir.Value, a: ir.Value) -> ir.Value:
        return op.Div(a, x)

    return apply_rules(model, [RewriteRule(pattern, replacement, name="ReciprocalMulToDiv")], "Mul of a Reciprocal", commute=True)
