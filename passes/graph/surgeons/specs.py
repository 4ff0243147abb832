"""Each surgeon's options, as a typed model: ``{surgeon: <Name>, ...its options}``, with Olive's
surgeon and option names so that an Olive ``GraphSurgeries`` step maps onto ``graph_surgery`` one
to one. A surgeon's name selects its model (a discriminated union on ``surgeon``); a name Olive
has but Kiln does not implement, or a name neither has, is a validation error that says which.

Light on purpose: the engine imports this module to validate workflows; the rewrites (onnx_ir,
onnxscript) live in the sibling modules and load when the pass runs."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeInt, model_validator

from engine.core import StrictConfig


class SurgeonSpec(StrictConfig):
    """Options every surgeon takes."""

    surgeon: str
    require_applied: bool | None = Field(
        None, description="Fail the pass when this surgeon finds nothing to rewrite. null = the pass's require_applied."
    )


class TieWordEmbeddings(SurgeonSpec):
    """The LM head reads the embedding table: Gather(embed) + MatMul(embed^T) -> Gemm(transB) on the
    embedding weight (when the two weights are equal), or GatherBlockQuantized + MatMulNBits sharing
    one quantized weight (when their quantized tensors are equal)."""

    surgeon: Literal["TieWordEmbeddings"]


class GemmToMatMulAdd(SurgeonSpec):
    """Gemm (alpha = beta = 1, transA = 0) -> MatMul (+ Add): the weight becomes visible to MatMul-only quantizers."""

    surgeon: Literal["GemmToMatMulAdd"]


class MatMulAddToGemm(SurgeonSpec):
    """MatMul with a 2D weight + Add of a 1D bias -> Gemm (reshaping a >2D input of static shape to 2D and back)."""

    surgeon: Literal["MatMulAddToGemm"]


class ReciprocalMulToDiv(SurgeonSpec):
    """a * Reciprocal(x) -> Div(a, x) (lets onnxruntime fuse the rsqrt form of RMSNorm)."""

    surgeon: Literal["ReciprocalMulToDiv"]


class SimplifiedLayerNormToL2Norm(SurgeonSpec):
    """(Skip)SimplifiedLayerNormalization -> (Add) LpNormalization(p=2) * (weight * sqrt(hidden))."""

    surgeon: Literal["SimplifiedLayerNormToL2Norm"]


class PowReduceSumPowDiv2LpNorm(SurgeonSpec):
    """x / ReduceSum(x ** 2, last axis) ** 0.5 -> LpNormalization(x, p=2, axis=-1)."""

    surgeon: Literal["PowReduceSumPowDiv2LpNorm"]


class RemoveRopeMultiCache(SurgeonSpec):
    """RotaryEmbedding / GroupQueryAttention cos and sin caches chosen by If(Greater) -> one cache initializer."""

    surgeon: Literal["RemoveRopeMultiCache"]
    use_large_cache: bool = Field(False, description="Keep the If's *_large caches (long contexts) instead of the *_small ones.")


class AttentionMaskToSequenceLengths(SurgeonSpec):
    """GroupQueryAttention's seqlens_k / total_sequence_length computed from attention_mask -> graph inputs
    past_seq_len (int32 [batch, 1]) and total_seq_len (int32 scalar); the mask subgraph and input go."""

    surgeon: Literal["AttentionMaskToSequenceLengths"]


class ReplaceAttentionMaskValue(SurgeonSpec):
    """Float constants below ``threshold`` feeding only mask ops (Add, Mul, Expand, Where, Shape) -> ``replacement``."""

    surgeon: Literal["ReplaceAttentionMaskValue"]
    threshold: float = Field(-3e30, description="Entries below this value are mask values.")
    replacement: float = Field(-1e4, description="The value they get (one that quantizes well).")


class RemoveGidxFromMatMulNBits(SurgeonSpec):
    """MatMulNBits' g_idx input when it is the identity grouping (channel i in group i // block_size) -> removed."""

    surgeon: Literal["RemoveGidxFromMatMulNBits"]


class QuantizeEmbeddingInt8(SurgeonSpec):
    """The embed_tokens Gather on an FP16/FP32 table -> GatherBlockQuantized on an INT8 table (blocks of 32)."""

    surgeon: Literal["QuantizeEmbeddingInt8"]


class ShareEmbeddingLmHead(SurgeonSpec):
    """After QuantizeEmbeddingInt8: the lm_head MatMulNBits -> an INT8 MatMulNBits reading the embedding's quantized table."""

    surgeon: Literal["ShareEmbeddingLmHead"]


class PackedAttentionToLoopMHA(SurgeonSpec):
    """custom::PackedAttention(q, k, v, cu_seqlens) -> a Loop over the segments calling com.microsoft MultiHeadAttention."""

    surgeon: Literal["PackedAttentionToLoopMHA"]


class DeduplicateSubgraphInitializers(SurgeonSpec):
    """Initializers of a Loop / If / Scan body that repeat a name -> the first one kept."""

    surgeon: Literal["DeduplicateSubgraphInitializers"]


class DeduplicateNodes(SurgeonSpec):
    """A node that produces an output name an earlier node produces -> removed (the model then loads)."""

    surgeon: Literal["DeduplicateNodes"]


class RemoveMemcpy(SurgeonSpec):
    """MemcpyToHost / MemcpyFromHost nodes (main graph and subgraphs) -> bypassed; onnxruntime re-inserts the copies it needs."""

    surgeon: Literal["RemoveMemcpy"]


class RenameInputs(SurgeonSpec):
    """Graph inputs renamed: ``old_names[i]`` -> ``new_names[i]``."""

    surgeon: Literal["RenameInputs"]
    old_names: list[str] = Field(min_length=1, description="The inputs to rename.")
    new_names: list[str] = Field(min_length=1, description="Their new names, in the same order.")

    @model_validator(mode="after")
    def _paired(self) -> RenameInputs:
        if len(self.old_names) != len(self.new_names):
            raise ValueError(f"old_names has {len(self.old_names)} names and new_names {len(self.new_names)}: they pair up one to one")
        if len(set(self.new_names)) != len(self.new_names) or len(set(self.old_names)) != len(self.old_names):
            raise ValueError("old_names and new_names must not repeat a name")
        return self


class RenameOutputDims(SurgeonSpec):
    """Dimension ``dim_idx`` of output ``output_idx`` -> the symbolic dimension ``dim_name``."""

    surgeon: Literal["RenameOutputDims"]
    output_idx: NonNegativeInt = Field(description="The output, by position.")
    dim_idx: NonNegativeInt = Field(description="The dimension, by position.")
    dim_name: str = Field(min_length=1, description="Its new symbolic name.")


class RenameInputDims(SurgeonSpec):
    """Dimension ``dim_idx`` of an input (by ``input_name`` or ``input_idx``) -> the symbolic dimension ``dim_name``."""

    surgeon: Literal["RenameInputDims"]
    dim_idx: NonNegativeInt = Field(description="The dimension, by position.")
    dim_name: str = Field(min_length=1, description="Its new symbolic name.")
    input_name: str | None = Field(None, description="The input, by name.")
    input_idx: NonNegativeInt | None = Field(None, description="The input, by position (when input_name is null).")

    @model_validator(mode="after")
    def _one_input(self) -> RenameInputDims:
        if (self.input_name is None) == (self.input_idx is None):
            raise ValueError("give the input by input_name or by input_idx (one of the two)")
        return self


SPECS: tuple[type[SurgeonSpec], ...] = (
    TieWordEmbeddings,
    GemmToMatMulAdd,
    RemoveRopeMultiCache,
    AttentionMaskToSequenceLengths,
    ReplaceAttentionMaskValue,
    SimplifiedLayerNormToL2Norm,
    RenameOutputDims,
    PackedAttentionToLoopMHA,
    MatMulAddToGemm,
    ReciprocalMulToDiv,
    RemoveGidxFromMatMulNBits,
    DeduplicateSubgraphInitializers,
    DeduplicateNodes,
    RenameInputDims,
    QuantizeEmbeddingInt8,
    ShareEmbeddingLmHead,
    RemoveMemcpy,
    PowReduceSumPowDiv2LpNorm,
    RenameInputs,
)
IMPLEMENTED = tuple(spec.__name__ for spec in SPECS)

#: Olive's other surgeons (olive/passes/onnx/graph_surgeries.py, 2026): refused by name as not implemented
NOT_IMPLEMENTED = (
    "RenameOutputs",
    "InferShapes",
    "RemoveShapes",
    "RemoveInitializerFromInputs",
    "ReorderInputs",
    "ReplaceErfWithTanh",
    "ZeroOutInput",
    "RemoveInputs",
    "ExposeOutputs",
    "ExposeQuantizedOutput",
    "DecomposeQuickGelu",
    "DecomposeRotaryEmbedding",
    "RMSNormToL2Norm",
    "SimplifiedLayerNormToRMSNorm",
    "RemoveQDQ",
    "MatMulToTransposeConvTranspose",
    "RemoveIntermediarySqueezeAndUnsqueeze",
    "QDQToClip",
    "RemoveDeqLin",
    "Non4DModelInputs",
    "Non4DModelOutputs",
    "StandaloneReduceSum",
    "Gather",
    "GatherElements",
    "Non4DInitializers",
    "RemoveAllTensorValueShapes",
    "Non4DReshape",
    "Non4DExpand",
    "Non4DTranspose",
    "Non4DSlice",
    "Non4DLpNorm",
    "Flatten",
    "AddIntermediateTensorsToOutputs",
    "ReshapeReduceSum",
    "ReshapeClipReduceSum",
    "ReduceMax",
    "PackedAttentionToPackedMHA",
)

Surgery = Annotated[
    TieWordEmbeddings
    | GemmToMatMulAdd
    | RemoveRopeMultiCache
    | AttentionMaskToSequenceLengths
    | ReplaceAttentionMaskValue
    | SimplifiedLayerNormToL2Norm
    | RenameOutputDims
    | PackedAttentionToLoopMHA
    | MatMulAddToGemm
    | ReciprocalMulToDiv
    | RemoveGidxFromMatMulNBits
    | DeduplicateSubgraphInitializers
    | DeduplicateNodes
    | RenameInputDims
    | QuantizeEmbeddingInt8
    | ShareEmbeddingLmHead
    | RemoveMemcpy
    | PowReduceSumPowDiv2LpNorm
    | RenameInputs,
    Field(discriminator="surgeon"),
]


def canonical_surgeon(item: Any) -> Any:
    """``item`` with its surgeon name spelled as Kiln spells it (Olive looks names up ignoring
    case); a name Kiln does not implement raises ValueError naming it."""
    if not isinstance(item, dict) or not isinstance(item.get("surgeon"), str):
        return item
    name = item["surgeon"]
    by_lower = {known.lower(): known for known in IMPLEMENTED}
    if name.lower() in by_lower:
        return {**item, "surgeon": by_lower[name.lower()]}
    olive_only = {known.lower(): known for known in NOT_IMPLEMENTED}
    if name.lower() in olive_only:
        raise ValueError(
            f"surgeon {olive_only[name.lower()]!r} (an Olive surgeon) is not implemented in Kiln; implemented: {', '.join(IMPLEMENTED)}"
        )
    close = difflib.get_close_matches(name, IMPLEMENTED, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown surgeon {name!r}{hint} (implemented: {', '.join(IMPLEMENTED)})")


@dataclass(frozen=True)
class Outcome:
    """What one surgeon did: ``count`` rewrites, or none and why."""

    count: int
    reason: str = ""

    @property
    def applied(self) -> bool:
        return self.count > 0

    def __str__(self) -> str:
        if self.applied:
            return f"applied: {self.count} rewrite{'s' if self.count != 1 else ''}{f' ({self.reason})' if self.reason else ''}"
        return f"not applied: {self.reason}"


def applied(count: int, note: str = "") -> Outcome:
    return Outcome(count, note)


def not_applied(reason: str) -> Outcome:
    return Outcome(0, reason)
