"""One node quantized in a model of its own: the node and its float weight, nothing else.

Weight-only quantizers that treat each node on its own (onnxruntime's MatMulNBitsQuantizer with
its DEFAULT algorithm) give the same node and initializers this way as in one run over the whole
model, without the whole float model in memory. Used by ``int4_weights`` (``passes.quantize.
nbits_run.quantize_alone``) and by the model builder's subprocess (``passes/generate/
_builder_run.py``), which is why this module imports nothing else of Kiln.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def copied(kind: Any, message: Any) -> Any:
    """A copy of ``message`` in an arena of its own: a part of a protobuf message kept alive keeps
    the whole message's arena, the float weight's bytes included, even once removed from it."""
    copy = kind()
    copy.CopyFrom(message)
    return copy


def quantize_alone(into: Any, node: Any, weight: Any, run: Callable[[Any], Any]) -> tuple[list[Any], list[Any]]:
    """``node`` and its float ``weight`` (a TensorProto with its data) quantized by ``run`` in a model
    of their own, with ``into``'s IR version and opsets; the nodes and initializers that come out,
    copied. ``into`` takes the IR version and opsets the quantizer raised (com.microsoft, 21 for
    int4 tensors)."""
    import onnx

    single = onnx.ModelProto(ir_version=into.ir_version, opset_import=into.opset_import)
    single.graph.node.append(node)
    single.graph.initializer.append(weight)
    done = run(single)
    nodes = [copied(onnx.NodeProto, part) for part in done.graph.node]
    initializers = [copied(onnx.TensorProto, part) for part in done.graph.initializer]
    versions = {o.domain: o.version for o in into.opset_import} | {o.domain: o.version for o in done.opset_import}
    del into.opset_import[:]
    into.opset_import.extend(onnx.helper.make_opsetid(domain, version) for domain, version in versions.items())
    into.ir_version = max(into.ir_version, done.ir_version)
    return nodes, initializers
