"""INT8 quantization of an ONNX model with Intel Neural Compressor (its ONNX Runtime adaptor),
in INC's own isolated environment (``passes.quantize._inc``).

One ``quantization.fit`` with no evaluation function: INC quantizes once with the given options
(no tuning). Dynamic mode needs no data; static mode calibrates on the dataset named by
``calibration`` (INC's calibration algorithms: minmax, kl, percentile) and writes QOperator
(``QLinearConv``, ``QLinearMatMul``...) or QDQ models. The output is saved with ``save_onnx``, so
the IR version is one every onnxruntime Kiln targets loads.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from engine.core import Categorical, ModelArtifact, PassContext, PassResult
from passes.common.library_logs import distinct
from passes.common.onnx_io import save_onnx
from passes.common.pass_io import onnx_output, open_onnx_input, require
from passes.quantize import _inc
from passes.quantize.onnx_facts import file_bytes, new_quantized_ops, op_counts


class IncQuantize(_inc.IncPass):
    name = "inc_quantize"
    summary = "INT8 quantization with Intel Neural Compressor (dynamic or static, QOperator or QDQ), in its own environment."
    version = "1"
    search_space = {
        "per_channel": Categorical((False, True)),
        "calibration_method": Categorical(("minmax", "kl", "percentile")),
        "quant_format": Categorical(("QOperator", "QDQ")),
    }

    Config = _inc.IncOptions
    config: _inc.IncOptions

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        (onnx,) = require("onnx", self.name, "onnx")
        cfg = self.config
        opened = open_onnx_input(model, ctx)
        source = _inc.readable_input(opened.source, opened.workdir)
        notes: list[str] = []
        feed = _inc.calibration_feed(cfg, ctx, opened.graph, notes)
        started = time.perf_counter()
        with _inc.inc_session(opened.workdir) as warnings:
            from neural_compressor import PostTrainingQuantConfig, quantization

            conf = PostTrainingQuantConfig(**_inc.conf_arguments(cfg, feed.samples if feed else None))
            loader = _inc.CalibrationLoader(feed) if feed is not None else None
            quantized = _inc.quantized_model(quantization.fit(str(source), conf, calib_dataloader=loader), f"mode {cfg.mode}")
        seconds = round(time.perf_counter() - started, 3)
        save_onnx(quantized, Path(ctx.output_dir))
        result = onnx_output(model, ctx, {}, notes)
        written = onnx.load(str(result.model.model_file), load_external_data=False)
        result.details.update(self._details(opened.graph, written, feed, warnings, seconds))
        result.details["bytes_before"] = file_bytes(model.model_file)
        result.details["bytes_after"] = file_bytes(result.model.model_file)
        if not result.details["quantized_ops"]:
            notes.append("Intel Neural Compressor quantized no op of this model: the output computes in float")
        return result

    def _details(self, before: Any, after: Any, feed: Any, warnings: list[Any], seconds: float) -> dict[str, Any]:
        cfg = self.config
        counts_before, counts_after = op_counts(before), op_counts(after)
        details: dict[str, Any] = {
            "mode": cfg.mode,
            "quant_format": cfg.quant_format,
            "per_channel": cfg.per_channel,
            "versions": _inc.versions(),
            "quantized_ops": new_quantized_ops(counts_before, counts_after),
            "nodes_before": sum(counts_before.values()),
            "nodes_after": sum(counts_after.values()),
            "ir_version": after.ir_version,
            "inc_warnings": distinct(warnings),
            "seconds": seconds,
        }
        if feed is not None:
            details["calibration"] = {
                "dataset": cfg.calibration,
                "method": cfg.calibration_method,
                "samples": feed.samples,
                "digest": feed.digest,
                "ignored_inputs": feed.ignored_inputs,
            }
        return details
