"""custom::PackedAttention (attention within each segment of a packed sequence, as vision
encoders export it) -> a Loop over the segments, each a com.microsoft MultiHeadAttention.

The rewrite gives ``custom::PackedAttention`` a body, written in onnxscript, and inlines it:
for each segment [cu_seqlens[i], cu_seqlens[i + 1]) the query, key and value rows of that
segment attend to each other only, which is what PackedAttention computes."""

from __future__ import annotations

from typing import Any

import onnx
import onnx_ir as ir
import onnxscript
from onnx_ir.passes.common import InlinePass, RemoveUnusedOpsetsPass

from passes.graph.surgeons.specs import Outcome, PackedAttentionToLoopMHA, applied, not_applied

CUSTOM = "custom"
MSFT = "com.microsoft"


def _packed_attention_function(opset_version: int) -> Any:  # long: one onnxscript function, the body of the op
    custom = onnxscript.values.Opset(CUSTOM, 1)
    op = onnxscript.values.Opset("", opset_version)
    msft_op = onnxscript.values.Opset(MSFT, 1)

    @onnxscript.script(opset=custom)
    def PackedAttention(query_states, key_states, value_states, cu_seqlens, scale: float, num_heads: int):  # type: ignore[no-untyped-def]
        # q, k, v: [B, num_heads, seq_len, head_dim] -> [B, seq_len, num_heads * head_dim]
        to_3d_shape = op.Constant(value_ints=[0, 0, -1])
        query_transposed = op.Transpose(query_states, perm=[0, 2, 1, 3])
        output_shape = op.Shape(query_transposed)
        query_3d = op.Reshape(query_transposed, to_3d_shape)
        value_3d = op.Reshape(op.Transpose(value_states, perm=[0, 2, 1, 3]), to_3d_shape)
        key_3d = op.Reshape(op.Transpose(key_states, perm=[0, 2, 1, 3]), to_3d_shape)
        num_patches = op.Size(cu_seqlens) - 1
        seq_axis = op.Constant(value_ints=[1])
        seq_axis_int32 = op.Cast(seq_axis, to=onnx.TensorProto.INT32)
        attn_output = op.Slice(value_3d, [0], [0], seq_axis)  # empty: segments are appended
        for i in range(num_patches):
            i_1d = op.Reshape(i, [1])
            i_plus_1_1d = i_1d + 1
            start = op.Gather(cu_seqlens, i_1d, axis=0)
            end = op.Gather(cu_seqlens, i_plus_1_1d, axis=0)
            query_i = op.Slice(query_3d, start, end, seq_axis_int32)
            key_i = op.Slice(key_3d, start, end, seq_axis_int32)
            value_i = op.Slice(value_3d, start, end, seq_axis_int32)
            mha_output = msft_op.MultiHeadAttention(query_i, key_i, value_i, num_heads=num_heads, scale=scale)
            attn_output = op.Concat(attn_output, mha_output, axis=1)
        return op.Reshape(attn_output, output_shape)  # [B, seq_len, num_heads, head_dim]

    return PackedAttention


def packed_attention_to_loop_mha(model: ir.Model, spec: PackedAttentionToLoopMHA) -> Outcome:
    nodes = [node for node in model.graph.all_nodes() if node.domain == CUSTOM and node.op_type == "PackedAttention"]
    if not nodes:
        return not_applied("no custom::PackedAttention in the graph")
    function = ir.serde.deserialize_function(_packed_attention_function(model.opset_imports.get("", 20)).to_function_proto())
    if function.identifier() in model.functions:
        return not_applied("the model defines custom::PackedAttention as a function already")
    model.functions[function.identifier()] = function
    model.opset_imports.setdefault(MSFT, 1)
    InlinePass()(model)
    RemoveUnusedOpsetsPass()(model)
    return applied(len(nodes))
