"""Olive's ``OnnxPeepholeOptimizer``, switch by switch, with the same libraries it uses.

In Olive's order: onnxscript's optimizer (``onnxscript.optimizer.optimize``: constant folding,
dead-code removal and its default rewrite rules; rerun without onnx's shape inference when that
fails on a type), the removal of a Reshape whose output only feeds a Reshape to ``[-1]``, the
``com.microsoft`` opset (version 1) declared on the model and every function where a graph
surgery's custom ops (LoopMHA...) lack it, and Cast round trips (``Cast(Cast(x, to=b), to=a)``
where ``x`` is already ``a``, as dynamo exports leave fp32→fp16→fp32) collapsed to an Identity by
onnxscript's rewriter. That rule, Olive's, checks only the types at both ends: a chain through a
narrower type (float → int32 → float, which truncates) goes too. onnxscript's rewriter also drops
an opset no node uses, the com.microsoft one included, as in Olive. Olive's ``onnxoptimizer_optimize`` (the onnxoptimizer package) is not here:
``onnx_simplify`` is Kiln's general cleanup.

With every rewrite off and only the opset fix and the Cast-chain rule on (how Olive's recipes
after a transformer fusion use it), the pass leaves the graph's math as it was.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import Field

from engine.core import ModelArtifact, PassConfig, PassContext, PassResult
from passes.common.graph_tools import op_delta, qualified_op_counts
from passes.common.onnx_io import OnnxPass, save_onnx
from passes.common.pass_io import onnx_output

MS_DOMAIN = "com.microsoft"


class OnnxPeephole(OnnxPass):
    name = "onnx_peephole"
    summary = (
        "Olive's peephole optimizer: onnxscript's optimizer, redundant Reshape removal, the com.microsoft opset declared "
        "where custom ops need it, Cast round trips removed; each a switch."
    )
    version = "1"
    accepts = ("onnx", "genai")
    produces = "onnx"
    keeps = ("genai",)
    libraries = ("onnx", "onnx-ir", "onnxscript", "numpy")

    class Config(PassConfig):
        onnxscript_optimize: bool = Field(
            True, description="Run onnxscript's optimizer (constant folding, dead-code removal, its default rewrite rules)."
        )
        fuse_reshape_operations: bool = Field(
            True, description="Drop a Reshape whose only consumer is a Reshape to [-1] (the second flattens anyway)."
        )
        fix_com_microsoft_opset: bool = Field(
            False, description="Declare the com.microsoft opset (version 1) on the model and every function that lacks it."
        )
        cast_chain_elimination: bool = Field(
            False, description="Replace Cast(Cast(x, to=b), to=a) by Identity(x) where x is already of type a."
        )

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        import onnx

        cfg = self.config
        proto = onnx.load(str(model.model_file))  # external data is read in too
        counts_in = qualified_op_counts(proto)
        started = time.perf_counter()
        done: dict[str, Any] = {}
        if cfg.onnxscript_optimize:
            proto, done["onnxscript_optimize"] = _onnxscript_optimize(proto)
        if cfg.fuse_reshape_operations:
            proto, done["fuse_reshape_operations"] = _fuse_reshapes(proto)
        if cfg.fix_com_microsoft_opset:
            done["fix_com_microsoft_opset"] = _declare_ms_opset(proto)
        if cfg.cast_chain_elimination:
            proto, done["cast_chain_elimination"] = _eliminate_cast_chains(proto)
        seconds = round(time.perf_counter() - started, 3)
        save_onnx(proto, Path(ctx.output_dir))
        counts_out = qualified_op_counts(proto)
        details = {
            "applied": done,
            "nodes_before": sum(counts_in.values()),
            "nodes_after": sum(counts_out.values()),
            "op_delta": op_delta(counts_in, counts_out),
            "seconds": seconds,
        }
        return onnx_output(model, ctx, details, [])


def _onnxscript_optimize(proto: Any) -> tuple[Any, str]:
    import onnxscript

    try:
        return onnxscript.optimizer.optimize(proto), "run"
    except Exception as error:  # Olive's fallback: only a type inference failure is retried
        if "TypeInferenceError" not in str(error):
            raise
        return onnxscript.optimizer.optimize(proto, onnx_shape_inference=False), f"run without onnx shape inference ({error})"


def _fuse_reshapes(proto: Any) -> tuple[Any, int]:
    """Olive's reshape fusion: Reshape → Reshape([-1]) with the first read only there reads its input directly."""
    import numpy as np
    from onnx_ir.passes.common import RemoveUnusedNodesPass
    from onnxscript import ir

    model = ir.from_proto(proto)
    changed = 0
    for node in model.graph.all_nodes():
        if node.op_type != "Reshape" or node.inputs[0] is None:
            continue
        data = node.inputs[0]
        previous = data.producer()
        shape = node.inputs[1] if len(node.inputs) > 1 else None
        value = ir.convenience.get_const_tensor(shape) if shape is not None else None
        flattens = value is not None and np.array_equal(value.numpy(), np.array([-1]))
        if previous is not None and previous.op_type == "Reshape" and flattens and len(tuple(data.uses())) == 1:
            node.replace_input_with(0, previous.inputs[0])
            changed += 1
    if not changed:
        return proto, 0
    RemoveUnusedNodesPass()(model)
    return ir.to_proto(model), changed


def _declare_ms_opset(proto: Any) -> list[str]:
    """Where com.microsoft v1 was declared: 'model' and the names of functions."""
    from onnx import helper

    added = []
    if MS_DOMAIN not in {entry.domain for entry in proto.opset_import}:
        proto.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
        added.append("model")
    for function in proto.functions:
        if MS_DOMAIN not in {entry.domain for entry in function.opset_import}:
            function.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
            added.append(f"function {function.domain}:{function.name}")
    return added


def _eliminate_cast_chains(proto: Any) -> tuple[Any, int]:
    """Olive's CastCastRoundTrip rule through onnxscript's rewriter; the Cast nodes removed."""
    from onnxscript import ir
    from onnxscript.rewriter import RewriteRule, rewrite
    from onnxscript.rewriter._basics import MatchResult

    def pattern(op: Any, x: Any, to: Any, to_ignored: Any) -> Any:
        return op.Cast(op.Cast(x, to=to_ignored), to=to)

    def check(context: Any, x: ir.Value, to: ir.Attr, to_ignored: ir.Attr) -> MatchResult:
        result = MatchResult()
        if x.dtype is None:
            return result.fail("Input dtype unknown; cannot verify round-trip")
        if x.dtype != to.as_int():
            return result.fail(f"Not a round-trip cast: input dtype {x.dtype} != final cast to={to.as_int()}")
        return result

    def replacement(op: Any, x: Any, **_: Any) -> Any:
        return op.Identity(x)

    casts = sum(1 for node in proto.graph.node if node.op_type == "Cast")
    rewritten = rewrite(proto, pattern_rewrite_rules=[RewriteRule(pattern, replacement, check, name="CastCastRoundTrip")])
    return rewritten, casts - sum(1 for node in rewritten.graph.node if node.op_type == "Cast")
