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
from typing import Any

from engine.core import Categorical, ModelArtifact, PassContext, PassResult
from passes.common.library_logs import distinct
from passes.common.pass_io import open_onnx_input, require
from passes.quantize import _inc, isolated_output


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
        require("onnx", self.name, "onnx")
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
        result, _ = isolated_output.quantized_output(model, ctx, opened.graph, quantized, notes, "Intel Neural Compressor")
        result.details.update(self._details(feed, warnings, seconds))
        return result

    def _details(self, feed: Any, warnings: list[Any], seconds: float) -> dict[str, Any]:
        cfg = self.config
        details: dict[str, Any] = {
            "mode": cfg.mode,
            "quant_format": cfg.quant_format,
            "per_channel": cfg.per_channel,
            "versions": _inc.versions(),
            "inc_warnings": distinct(warnings),
            "seconds": seconds,
        }
        if feed is not None:
            details["calibration"] = isolated_output.calibration_details(cfg.calibration or "", feed, method=cfg.calibration_method)
        return details
