"""Which rewrite each surgeon runs, and the loop that applies them in order.

Most surgeons rewrite an ``onnx_ir`` model. Two repair what onnx_ir cannot load or keeps
silently (a tensor produced by two nodes; a subgraph initializer name given twice) and so work
on the ``onnx.ModelProto``; the loop converts between the two only where the order needs it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import onnx
import onnx_ir as ir
from onnx_ir.passes.common import DeduplicateHashedInitializersPass

from passes.graph.surgeons import cleanup, decoder, embeddings, linear, names, norms, packed_attention
from passes.graph.surgeons.specs import Outcome, SurgeonSpec

IR_SURGEONS: dict[str, Callable[[ir.Model, Any], Outcome]] = {
    "TieWordEmbeddings": embeddings.tie_word_embeddings,
    "GemmToMatMulAdd": linear.gemm_to_matmul_add,
    "RemoveRopeMultiCache": decoder.remove_rope_multi_cache,
    "AttentionMaskToSequenceLengths": decoder.attention_mask_to_sequence_lengths,
    "ReplaceAttentionMaskValue": decoder.replace_attention_mask_value,
    "SimplifiedLayerNormToL2Norm": norms.simplified_layer_norm_to_l2_norm,
    "RenameOutputDims": names.rename_output_dims,
    "PackedAttentionToLoopMHA": packed_attention.packed_attention_to_loop_mha,
    "MatMulAddToGemm": linear.matmul_add_to_gemm,
    "ReciprocalMulToDiv": linear.reciprocal_mul_to_div,
    "RemoveGidxFromMatMulNBits": decoder.remove_gidx_from_matmul_nbits,
    "RenameInputDims": names.rename_input_dims,
    "QuantizeEmbeddingInt8": embeddings.quantize_embedding_int8,
    "ShareEmbeddingLmHead": embeddings.share_embedding_lm_head,
    "RemoveMemcpy": cleanup.remove_memcpy,
    "PowReduceSumPowDiv2LpNorm": norms.pow_reduce_sum_pow_div_to_lp_norm,
    "RenameInputs": names.rename_inputs,
}
PROTO_SURGEONS: dict[str, Callable[[onnx.ModelProto, Any], Outcome]] = {
    "DeduplicateSubgraphInitializers": cleanup.deduplicate_subgraph_initializers,
    "DeduplicateNodes": cleanup.deduplicate_nodes,
}


def surgery_keys(specs: Sequence[SurgeonSpec]) -> list[str]:
    """Each surgery's key in the details: its surgeon's name, ``Name#2`` for its second use..."""
    seen: dict[str, int] = {}
    keys = []
    for spec in specs:
        seen[spec.surgeon] = seen.get(spec.surgeon, 0) + 1
        keys.append(spec.surgeon if seen[spec.surgeon] == 1 else f"{spec.surgeon}#{seen[spec.surgeon]}")
    return keys


def _to_ir(model: onnx.ModelProto | ir.Model) -> ir.Model:
    if isinstance(model, ir.Model):
        return model
    try:
        return ir.serde.deserialize_model(model)
    except ir.serde.SerdeError as error:
        raise ValueError(
            f"the model does not load into onnx_ir ({error.__cause__ or error}); a DeduplicateNodes surgery first may repair it"
        ) from error


def apply_surgeries(
    proto: onnx.ModelProto, specs: Sequence[SurgeonSpec], remove_duplicate_initializers: bool
) -> tuple[onnx.ModelProto, dict[str, Outcome], int]:
    """The model after every surgery, each surgery's outcome by key, and how many duplicate
    initializers were removed afterwards."""
    model: onnx.ModelProto | ir.Model = proto
    outcomes: dict[str, Outcome] = {}
    for key, spec in zip(surgery_keys(specs), specs, strict=True):
        if spec.surgeon in PROTO_SURGEONS:
            if isinstance(model, ir.Model):
                model = ir.serde.serialize_model(model)
            outcomes[key] = PROTO_SURGEONS[spec.surgeon](model, spec)
        else:
            model = _to_ir(model)
            outcomes[key] = IR_SURGEONS[spec.surgeon](model, spec)
    deduplicated = 0
    if remove_duplicate_initializers:
        model = _to_ir(model)
        before = len(model.graph.initializers)
        DeduplicateHashedInitializersPass()(model)
        deduplicated = before - len(model.graph.initializers)
    if isinstance(model, ir.Model):
        model = ir.serde.serialize_model(model)
    return model, outcomes, deduplicated
