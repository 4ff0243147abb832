"""INT8 post-training quantization with NNCF (``nncf.quantize``) on OpenVINO IR or ONNX.

NNCF calibrates activation ranges on a dataset, inserts FakeQuantize nodes before the ops it
quantizes (MatMul, Conv, ...) and stores their weights in INT8. ONNX inputs are read into
OpenVINO in memory first, so the output is always OpenVINO IR; it keeps the precision hint of the
input IR (set it with ``openvino_convert``), and inputs without one keep none.

numpy, openvino and nncf are imported inside ``run``: the engine imports this module when it
validates a workflow, only to read ``Config``, and that must stay fast.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from engine.core import Categorical, ModelArtifact, PassContext, PassResult
from passes.openvino._base import OpenVinoPass, QuantizeOptions, check_outputs_kept


class NncfQuantize(OpenVinoPass):
    name = "nncf_quantize"
    summary = "INT8 post-training quantization of OpenVINO IR or ONNX with NNCF (FakeQuantize + INT8 weights), calibrated on a dataset."
    version = "1"
    accepts = ("openvino", "onnx")
    produces = "openvino"
    libraries = ("openvino", "nncf")
    search_space = {
        "preset": Categorical(("performance", "mixed")),
        "fast_bias_correction": Categorical((True, False)),
        "subset_size": Categorical((64, 128, 300)),
        "smooth_quant_alpha": Categorical((0.5, 0.8, 0.95, -1.0)),
    }

    class Config(QuantizeOptions):
        pass

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        # nncf and openvino take seconds to import: only when the pass runs. Telemetry is declined
        # before nncf is imported: its import sets up (and may send) usage statistics
        from passes.openvino._quiet import decline_telemetry, library_output

        decline_telemetry()
        import nncf

        from passes.openvino import _nncf, _nncf_shared

        cfg = self.config
        notes: list[str] = []
        source = _nncf.read(model)
        items = _nncf.calibration_items(ctx, cfg.calibration, source.model)
        subset_size = _nncf.subset(cfg.subset_size, len(items), notes)
        started = time.perf_counter()
        with library_output() as output, _nncf_shared.shared(ctx.cache_dir, model.digest) as sharing:
            quantized = nncf.quantize(
                source.model,
                nncf.Dataset(items),
                **_nncf.quantize_arguments(cfg, subset_size),
            )
        notes.extend(sharing.notes())
        seconds = round(time.perf_counter() - started, 3)
        check_outputs_kept(source.model, quantized)
        _nncf.write(quantized, ctx, source.hint)
        facts = _nncf.quantization_facts(source, quantized)
        if facts["fake_quantize_nodes"] == 0:
            notes.append("NNCF inserted no FakeQuantize node: nothing in the model was quantized (check ignored_scope and target_device)")
        details: dict[str, Any] = {
            **source.facts,
            **facts,
            "preset": cfg.preset,
            "model_type": cfg.model_type,
            "target_device": cfg.target_device,
            "subset_size": subset_size,
            "calibration_samples": len(items),
            "fast_bias_correction": cfg.fast_bias_correction,
            "smooth_quant_alpha": cfg.smooth_quant_alpha,
            "ignored_scope": cfg.ignored_scope.to_json(),
            "inference_precision_hint": source.hint,
            "library_warnings": output.lines(),
            "calibration_shared": bool(sharing.served),
            "seconds": seconds,
        }
        return PassResult(
            model=ModelArtifact.from_folder("openvino", Path(ctx.output_dir), attrs=model.attrs), details=details, notes=notes
        )
