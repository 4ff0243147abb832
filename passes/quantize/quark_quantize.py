"""Static QDQ quantization of an ONNX model with AMD Quark's ONNX quantizer (``quark.onnx``'s
``ModelQuantizer`` with a ``QConfig``), in Quark's own isolated environment
(``passes.quantize._quark``).

The options are Quark's: how activations and weights are quantized (data type, symmetry,
calibration method, granularity, scale type: Quark's global configuration), nodes kept in float,
Quark's algorithms (CLE, SmoothQuant, AdaRound, AdaQuant, ...) and its extra options (such as
``EnableNPUCnn``, Vitis AI's NPU constraints for CNNs). Quark calibrates on the workflow dataset
named by ``calibration``. Quark writes the model into the job's work folder; the pass saves it
with ``save_onnx``, so the IR version is one every onnxruntime Kiln targets loads. A model that
needs Quark's custom ops (BFP16, the float data types) is said to in the notes: stock onnxruntime
cannot run it without Quark's custom-op library.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from engine.core import ModelArtifact, PassContext, PassResult
from passes.common.library_logs import distinct
from passes.common.onnx_io import OnnxPass, save_onnx
from passes.common.pass_io import onnx_output, open_onnx_input, require
from passes.quantize import _quark
from passes.quantize._inc import readable_input
from passes.quantize.onnx_facts import file_bytes, new_quantized_ops, op_counts

#: the domain of Quark's onnxruntime custom ops
QUARK_DOMAIN = "com.amd.quark"


class QuarkQuantize(OnnxPass):
    name = "quark_quantize"
    summary = "Static QDQ quantization with AMD Quark's ONNX quantizer (quark.onnx), in its own environment."
    version = "1"
    accepts = ("onnx",)
    produces = "onnx"
    libraries = _quark.QUARK_LIBRARIES
    environment = _quark.QUARK_ENVIRONMENT
    default_timeout_s = 3600.0
    #: the algorithms the pass runs, with the options it sets on each (import-olive reads them)
    algorithm_options = _quark.ALGORITHM_OPTIONS

    Config = _quark.QuarkOptions
    config: _quark.QuarkOptions

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        (onnx,) = require("onnx", self.name, "onnx")
        from passes.quantize.calibration import model_inputs, prepare_feed

        cfg = self.config
        opened = open_onnx_input(model, ctx)
        source = readable_input(opened.source, opened.workdir)
        notes: list[str] = []
        dataset = ctx.dataset(cfg.calibration)
        wanted = cfg.calibration_samples or len(dataset)
        if len(dataset) < wanted:
            notes.append(
                f"calibration dataset '{cfg.calibration}' has {len(dataset)} samples, fewer than calibration_samples {wanted}: all are used"
            )
            wanted = len(dataset)
        feed = prepare_feed(dataset, cfg.calibration, model_inputs(opened.graph), wanted, 1)
        written_by_quark = opened.workdir / "quark_output" / "model.onnx"
        written_by_quark.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with _quark.quark_session() as warnings:
            from quark.onnx import ModelQuantizer

            ModelQuantizer(_quark.q_config(cfg)).quantize_model(str(source), str(written_by_quark), _quark.reader(feed.batches))
        seconds = round(time.perf_counter() - started, 3)
        quantized = onnx.load(str(written_by_quark))
        save_onnx(quantized, Path(ctx.output_dir))
        result = onnx_output(model, ctx, {}, notes)
        written = onnx.load(str(result.model.model_file), load_external_data=False)
        result.details.update(self._details(opened.graph, written, feed, warnings, seconds))
        result.details["bytes_before"] = file_bytes(model.model_file)
        result.details["bytes_after"] = file_bytes(result.model.model_file)
        if not result.details["quantized_ops"]:
            notes.append("Quark quantized no op of this model: the output computes in float")
        if any(node.domain == QUARK_DOMAIN for node in written.graph.node):
            notes.append(
                f"the model uses Quark's custom ops (domain {QUARK_DOMAIN}): ONNX Runtime runs it only with Quark's "
                "custom-op library registered (quark.onnx.get_library_path())"
            )
        return result

    def _details(self, before: Any, after: Any, feed: Any, warnings: list[Any], seconds: float) -> dict[str, Any]:
        cfg = self.config
        counts_before, counts_after = op_counts(before), op_counts(after)
        return {
            "activation": cfg.activation.model_dump(),
            "weight": cfg.weight.model_dump(),
            "algorithms": [a["name"] for a in cfg.algorithms],
            "versions": _quark.versions(),
            "quantized_ops": new_quantized_ops(counts_before, counts_after),
            "nodes_before": sum(counts_before.values()),
            "nodes_after": sum(counts_after.values()),
            "ir_version": after.ir_version,
            "quark_warnings": distinct(warnings),
            "seconds": seconds,
            "calibration": {
                "dataset": cfg.calibration,
                "samples": feed.samples,
                "digest": feed.digest,
                "ignored_inputs": feed.ignored_inputs,
            },
        }
