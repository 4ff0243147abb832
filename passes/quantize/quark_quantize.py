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
from typing import Any

from engine.core import ModelArtifact, PassContext, PassResult
from passes.common.library_logs import distinct
from passes.common.onnx_io import OnnxPass
from passes.common.pass_io import open_onnx_input, require
from passes.quantize import _quark, isolated_output
from passes.quantize._inc import readable_input

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
        cfg = self.config
        opened = open_onnx_input(model, ctx)
        source = readable_input(opened.source, opened.workdir)
        notes: list[str] = []
        feed = isolated_output.calibration_feed(cfg.calibration, cfg.calibration_samples, ctx, opened.graph, notes)
        written_by_quark = opened.workdir / "quark_output" / "model.onnx"
        written_by_quark.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with _quark.quark_session() as warnings:
            from quark.onnx import ModelQuantizer

            ModelQuantizer(_quark.q_config(cfg)).quantize_model(str(source), str(written_by_quark), _quark.reader(feed.batches))
        seconds = round(time.perf_counter() - started, 3)
        quantized = onnx.load(str(written_by_quark))
        result, written = isolated_output.quantized_output(model, ctx, opened.graph, quantized, notes, "Quark")
        result.details.update(self._details(feed, warnings, seconds))
        if any(node.domain == QUARK_DOMAIN for node in written.graph.node):
            notes.append(
                f"the model uses Quark's custom ops (domain {QUARK_DOMAIN}): ONNX Runtime runs it only with Quark's "
                "custom-op library registered (quark.onnx.get_library_path())"
            )
        return result

    def _details(self, feed: Any, warnings: list[Any], seconds: float) -> dict[str, Any]:
        cfg = self.config
        return {
            "activation": cfg.activation.model_dump(),
            "weight": cfg.weight.model_dump(),
            "algorithms": [a["name"] for a in cfg.algorithms],
            "versions": _quark.versions(),
            "quark_warnings": distinct(warnings),
            "seconds": seconds,
            "calibration": isolated_output.calibration_details(cfg.calibration, feed),
        }
