"""Graph cleanup with onnxslim: constant folding, dead node and common subexpression
elimination, onnxslim's pattern fusions and shape inference, repeated until the graph stops
changing. Standard ops in, standard ops out: the result loads in any ONNX runtime.

Order matters for transformers: run ``ort_fusion`` *before* this pass, not after. onnxslim folds
and rewrites the subgraphs onnxruntime's transformer optimizer matches; on a tiny BERT (eager
TorchScript export) simplifying first left attention and the embedding LayerNorm unfused
(0 Attention instead of 2, 93 nodes instead of 18 after fusion).

onnxslim keeps its switches in class attributes (``OptimizationSettings``), so two slim calls
must not run at once in one process; the engine runs one pass per worker process.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from pydantic import Field, PositiveInt, field_validator

from engine.core import Categorical, ModelArtifact, PassConfig, PassContext, PassResult
from passes.common.graph_tools import op_delta, qualified_op_counts, quiet_library
from passes.common.onnx_io import OnnxPass, save_onnx
from passes.common.pass_io import onnx_output, require

_ATTENTION_OPS = ("Attention", "MultiHeadAttention")


class OnnxSimplify(OnnxPass):
    name = "onnx_simplify"
    summary = (
        "Clean up an ONNX graph with onnxslim: constant folding, dead-node and duplicate elimination, pattern fusions, shape inference."
    )
    version = "1"
    accepts = ("onnx",)
    produces = "onnx"
    libraries = ("onnxslim", "onnx", "onnxruntime")
    search_space = {"graph_fusion": Categorical((True, False))}

    class Config(PassConfig):
        constant_folding: bool = Field(
            True,
            description="Evaluate subgraphs whose inputs are all constants (shape arithmetic, weight transposes...) and store the results as initializers.",
        )
        fold_size_limit: PositiveInt | None = Field(
            None,
            description="Do not fold a constant whose result would exceed this many bytes (keeps large expanded tensors out of the file). null = fold every constant.",
        )
        dead_node_elimination: bool = Field(
            True, description="Remove nodes whose outputs nothing uses, and no-op nodes (identity reshapes, casts to the same type...)."
        )
        subexpression_elimination: bool = Field(True, description="Merge nodes that compute the same thing from the same inputs.")
        weight_tying: bool = Field(True, description="Store identical initializers once.")
        graph_fusion: bool = Field(
            True,
            description=(
                "onnxslim's pattern rewrites with standard ops: Conv+BatchNorm/Add/Mul, MatMul+Add -> Gemm, Pad+Conv, "
                "redundant Reshape/Transpose/Slice/Concat/Unsqueeze elimination (see skip_fusion_patterns)."
            ),
        )
        skip_fusion_patterns: list[str] = Field(
            default_factory=list,
            description=(
                "onnxslim fusion patterns not to apply, by name (onnxslim 0.1.98: EliminationConcat, EliminationReshape, "
                "EliminationReshapeAs, EliminationSlice, EliminationTranspose, EliminationTransposeViewTranspose, "
                "EliminationUnsqueeze, EliminationTransposeAsReshape, FusionConcatReshape, FusionConvAdd, FusionConvTransposeAdd, "
                "FusionConvBN, FusionConvTransposeBN, FusionConvMul, FusionConvTransposeMul, FusionGemm, FusionGemmMul, "
                "FusionGemmAdd, FusionPadConv, FusionReduce). An unknown name is an error."
            ),
        )
        shape_inference: bool = Field(
            True,
            description="Infer the shapes of intermediate tensors (symbolic, falling back to onnx's) and store them in the graph; also lets later rounds simplify more.",
        )

        @field_validator("skip_fusion_patterns")
        @classmethod
        def _distinct(cls, names: list[str]) -> list[str]:
            if len(set(names)) != len(names):
                raise ValueError(f"names a pattern twice: {names}")
            return sorted(names)

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        # onnx and onnxslim (which imports onnxruntime) take seconds to import: load them only when
        # the pass runs (the engine imports pass modules when it validates a workflow)
        import onnx

        onnxslim, registry = require("onnxslim", self.name, "onnxslim", "onnxslim.core.pattern.registry")
        from passes.quantize.onnx_facts import initializer_bytes

        cfg = self.config
        unknown = [name for name in cfg.skip_fusion_patterns if name not in registry.DEFAULT_FUSION_PATTERNS]
        if unknown:
            raise ValueError(
                f"skip_fusion_patterns: onnxslim has no pattern {', '.join(unknown)}; known: {', '.join(registry.DEFAULT_FUSION_PATTERNS)}"
            )
        skipped = [
            name
            for name, enabled in (
                ("constant_folding", cfg.constant_folding),
                ("dead_node_elimination", cfg.dead_node_elimination),
                ("subexpression_elimination", cfg.subexpression_elimination),
                ("weight_tying", cfg.weight_tying),
                ("graph_fusion", cfg.graph_fusion),
            )
            if not enabled
        ]

        source = onnx.load(str(model.model_file))  # external data is read in too
        before = {
            "counts": qualified_op_counts(source),
            "initializer_bytes": initializer_bytes(source),
            "initializers": len(source.graph.initializer),
        }
        # onnxslim gives its logger a stderr handler unless it has one: give it a silent one (its
        # records still reach the root logger, where quiet_library collects them)
        slim_logger = logging.getLogger("onnxslim")
        if not slim_logger.handlers:
            slim_logger.addHandler(logging.NullHandler())

        started = time.perf_counter()
        with quiet_library() as messages:
            output = onnxslim.slim(
                source,
                no_shape_infer=not cfg.shape_inference,
                skip_optimizations=skipped or None,
                skip_fusion_patterns=cfg.skip_fusion_patterns or None,
                size_threshold=cfg.fold_size_limit,
            )
        seconds = round(time.perf_counter() - started, 3)
        if output is None:
            raise ValueError("onnxslim returned no model")

        out_file = save_onnx(output, Path(ctx.output_dir))
        details, notes = self._details(model, before, output, out_file, skipped, messages, seconds)
        ctx.logger.debug("onnx_simplify %s: %d -> %d nodes", ctx.step_id, details["nodes_before"], details["nodes_after"])
        return onnx_output(model, ctx, details, notes)

    def _details(
        self,
        model: ModelArtifact,
        before: dict[str, Any],
        output: Any,
        out_file: Path,
        skipped: list[str],
        messages: list[str],
        seconds: float,
    ) -> tuple[dict[str, Any], list[str]]:
        from passes.quantize.onnx_facts import file_bytes, initializer_bytes

        cfg = self.config
        counts_in, counts_out = before["counts"], qualified_op_counts(output)
        notes = []
        if counts_in.get("Softmax") and counts_in.get("MatMul") and not any(counts_in.get(op) for op in _ATTENTION_OPS):
            notes.append(
                "the model has unfused attention (MatMul + Softmax): if it is meant for onnxruntime's transformer fusion "
                "(ort_fusion), run ort_fusion before onnx_simplify; simplified graphs no longer match its attention patterns"
            )
        details = {
            "skipped_optimizations": skipped,
            "skip_fusion_patterns": cfg.skip_fusion_patterns,
            "shape_inference": cfg.shape_inference,
            "nodes_before": sum(counts_in.values()),
            "nodes_after": sum(counts_out.values()),
            "op_counts_before": counts_in,
            "op_counts_after": counts_out,
            "op_delta": op_delta(counts_in, counts_out),
            "initializers_before": before["initializers"],
            "initializers_after": len(output.graph.initializer),
            "initializer_bytes_before": before["initializer_bytes"],
            "initializer_bytes_after": initializer_bytes(output),
            "size_bytes_before": file_bytes(model.model_file),
            "size_bytes_after": file_bytes(out_file),
            "library_warnings": messages,
            "seconds": seconds,
        }
        return details, notes
