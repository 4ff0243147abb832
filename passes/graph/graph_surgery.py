"""Named rewrites of an ONNX graph applied in order: Olive's ``GraphSurgeries`` with its surgeon
and option names (``{surgeon: TieWordEmbeddings}``, ``{surgeon: RenameOutputDims, output_idx: 0,
dim_idx: 1, dim_name: num_tokens}``...), each a small rewrite in ``passes/graph/surgeons``.

Every surgeon reports what it did in the result's details (``surgeries``: ``"applied: 2
rewrites"`` or ``"not applied: <why>"``); Olive passes a model it did not change on silently.
``require_applied`` (the pass's, or a surgeon's own) makes "not applied" a failure.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from engine.core import ModelArtifact, PassConfig, PassContext, PassResult
from passes.common.graph_tools import op_delta, qualified_op_counts
from passes.common.onnx_io import OnnxPass, save_onnx
from passes.common.pass_io import onnx_output
from passes.graph.surgeons.specs import IMPLEMENTED, Surgery, canonical_surgeon


class GraphSurgery(OnnxPass):
    name = "graph_surgery"
    summary = "Apply named graph rewrites (Olive's graph surgeons) in order, each reporting whether it applied."
    version = "1"
    accepts = ("onnx", "genai")
    produces = "onnx"
    keeps = ("genai",)
    libraries = ("onnx", "onnx-ir", "onnxscript", "numpy")

    class Config(PassConfig):
        surgeries: list[Surgery] = Field(
            min_length=1,
            description=(
                "The surgeons to apply, in order: each {surgeon: <Name>, ...its options}, with Olive's names (case ignored). "
                f"Implemented: {', '.join(IMPLEMENTED)}."
            ),
        )
        remove_duplicate_initializers: bool = Field(
            True, description="After the surgeries, store initializers of identical content once (as Olive does by default)."
        )
        require_applied: bool = Field(
            False, description="Fail the pass when a surgeon finds nothing to rewrite (a surgeon's own require_applied overrides this)."
        )

        @field_validator("surgeries", mode="before")
        @classmethod
        def _known_surgeons(cls, items: Any) -> Any:
            return [canonical_surgeon(item) for item in items] if isinstance(items, list) else items

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        # onnx, onnx_ir and onnxscript take about a second to import: load them when the pass runs
        import onnx

        from passes.graph.surgeons.table import apply_surgeries

        cfg = self.config
        proto = onnx.load(str(model.model_file))  # external data is read in too
        counts_in = qualified_op_counts(proto)
        started = time.perf_counter()
        output, outcomes, deduplicated = apply_surgeries(proto, cfg.surgeries, cfg.remove_duplicate_initializers)
        seconds = round(time.perf_counter() - started, 3)
        failed = [
            f"{key}: {outcome}"
            for (key, outcome), spec in zip(outcomes.items(), cfg.surgeries, strict=True)
            if not outcome.applied and (cfg.require_applied if spec.require_applied is None else spec.require_applied)
        ]
        if failed:
            raise ValueError(f"require_applied: {'; '.join(failed)}")
        save_onnx(output, Path(ctx.output_dir))
        counts_out = qualified_op_counts(output)
        details = {
            "surgeries": {key: str(outcome) for key, outcome in outcomes.items()},
            "duplicate_initializers_removed": deduplicated,
            "nodes_before": sum(counts_in.values()),
            "nodes_after": sum(counts_out.values()),
            "op_delta": op_delta(counts_in, counts_out),
            "seconds": seconds,
        }
        notes = [f"{key} {outcome}" for key, outcome in outcomes.items() if not outcome.applied]
        return onnx_output(model, ctx, details, notes)
