"""What the quantizers that run in their vendor's isolated environment share (Intel Neural
Compressor's ``inc_quantize``, AMD Quark's ``quark_quantize``): the calibration samples they take
from the workflow dataset, and how the vendor's model becomes the pass's output with the facts
both report (what was quantized, node counts, IR version, sizes).

onnx is imported only when called: the engine imports pass modules just to read their configs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from passes.common.onnx_io import save_onnx
from passes.common.pass_io import onnx_output
from passes.quantize.onnx_facts import file_bytes, new_quantized_ops, op_counts

if TYPE_CHECKING:
    import onnx

    from engine.core import ModelArtifact, PassContext, PassResult
    from passes.quantize.calibration import CalibrationFeed


def calibration_feed(name: str, wanted: int | None, ctx: PassContext, graph: onnx.ModelProto, notes: list[str]) -> CalibrationFeed:
    """The first ``wanted`` samples (all when None) of dataset ``name``, one per batch, as the model's
    inputs; a dataset with fewer is used whole, said in ``notes``."""
    from passes.quantize.calibration import model_inputs, prepare_feed

    dataset = ctx.dataset(name)
    count = wanted or len(dataset)
    if len(dataset) < count:
        notes.append(f"calibration dataset '{name}' has {len(dataset)} samples, fewer than calibration_samples {count}: all are used")
        count = len(dataset)
    return prepare_feed(dataset, name, model_inputs(graph), count, 1)


def quantized_output(
    model: ModelArtifact, ctx: PassContext, before: onnx.ModelProto, quantized: onnx.ModelProto, notes: list[str], library: str
) -> tuple[PassResult, onnx.ModelProto]:
    """``quantized`` saved as the pass's output (``save_onnx``: an IR version every onnxruntime Kiln
    targets loads), with the facts of what changed from ``before`` in its details; the model as written."""
    import onnx

    save_onnx(quantized, Path(ctx.output_dir))
    result = onnx_output(model, ctx, {}, notes)
    written = onnx.load(str(result.model.model_file), load_external_data=False)
    counts_before, counts_after = op_counts(before), op_counts(written)
    result.details.update(
        {
            "quantized_ops": new_quantized_ops(counts_before, counts_after),
            "nodes_before": sum(counts_before.values()),
            "nodes_after": sum(counts_after.values()),
            "ir_version": written.ir_version,
            "bytes_before": file_bytes(model.model_file),
            "bytes_after": file_bytes(result.model.model_file),
        }
    )
    if not result.details["quantized_ops"]:
        notes.append(f"{library} quantized no op of this model: the output computes in float")
    return result, written


def calibration_details(name: str, feed: CalibrationFeed, **extra: Any) -> dict[str, Any]:
    """How a pass calibrated: the dataset, the samples it took and their digest, the inputs it left out."""
    return {"dataset": name, **extra, "samples": feed.samples, "digest": feed.digest, "ignored_inputs": feed.ignored_inputs}
