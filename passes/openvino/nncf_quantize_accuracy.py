"""INT8 quantization with accuracy control (``nncf.quantize_with_accuracy_control``), judged by
one of the workflow's own evaluators.

NNCF quantizes the model, measures it, and while the metric drops by more than ``max_drop``
it reverts the groups of quantized ops that cost the most back to floating point. Its metric is
``validation``: an evaluation of the workflow's ``evaluate:`` list (say ``fidelity``), run by the
engine (``ctx.measure``) on this step's target against this step's input model; ``metric``
names the value to watch (``cosine_mean``). That makes the pass target-dependent.

ONNX inputs are read into OpenVINO in memory; the output is OpenVINO IR carrying the precision
hint of the input IR. numpy, openvino and nncf are imported inside ``run``: the engine imports
this module when it validates a workflow, and that must stay fast.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from engine.core import Categorical, KilnError, ModelArtifact, PassContext, PassResult
from engine.core.refs import EvaluationRef
from passes.openvino._base import OpenVinoPass, QuantizeOptions, check_outputs_kept


class NncfQuantizeAccuracy(OpenVinoPass):
    name = "nncf_quantize_accuracy"
    summary = "INT8 quantization with NNCF that reverts the costliest ops to float until a workflow metric drops by at most max_drop."
    version = "2"  # 2: nothing reverted, the model is written as nncf_quantize writes it
    accepts = ("openvino", "onnx")
    produces = "openvino"
    target_dependent = True
    libraries = ("openvino", "nncf")
    search_space = {"preset": Categorical(("performance", "mixed")), "subset_size": Categorical((64, 128, 300))}

    class Config(QuantizeOptions):
        validation: EvaluationRef = Field(
            description="Id of the workflow evaluation NNCF validates with (an entry of `evaluate:`, e.g. fidelity)."
        )
        metric: str = Field(description="The value of that evaluation to watch, e.g. cosine_mean for fidelity.")
        metric_goal: Literal["max", "min"] = Field(
            default="max", description="max: higher is better (cosine_mean, accuracy); min: lower is better (max_abs_error)."
        )
        max_drop: float = Field(default=0.01, ge=0, description="Largest drop of the metric allowed against the input model.")
        drop_type: Literal["absolute", "relative"] = Field(
            default="absolute", description="absolute: initial - quantized; relative: (initial - quantized) / initial."
        )
        max_num_iterations: int = Field(
            default=20, ge=1, description="Most groups of ops reverted to float, one per iteration (each iteration measures once or more)."
        )
        validation_samples: int = Field(
            default=16,
            ge=1,
            description="How many calibration samples NNCF is told the validation set has. The evaluator reads its own data; "
            "this only sizes NNCF's bookkeeping.",
        )

        @model_validator(mode="after")
        def _relative_needs_max(self) -> NncfQuantizeAccuracy.Config:
            if self.metric_goal == "min" and self.drop_type == "relative":
                raise ValueError(
                    "drop_type relative needs metric_goal max: NNCF sees a lower-is-better metric turned around, whose ratio means nothing"
                )
            return self

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        # nncf and openvino take seconds to import: only when the pass runs. Telemetry is declined
        # before nncf is imported: its import sets up (and may send) usage statistics
        from passes.openvino._quiet import decline_telemetry, library_output

        decline_telemetry()
        from passes.openvino import _accuracy, _ir, _nncf, _nncf_shared

        cfg = self.config
        if ctx.measure is None:
            raise KilnError(f"step '{ctx.step_id}' needs the engine's measure function to run evaluation '{cfg.validation}'")
        notes: list[str] = []
        source = _nncf.read(model)
        items = _nncf.calibration_items(ctx, cfg.calibration, source.model)
        subset_size = _nncf.subset(cfg.subset_size, len(items), notes)
        validator = _accuracy.Validator(
            ctx.measure, cfg.validation, cfg.metric, cfg.metric_goal, Path(ctx.workdir), source.hint, dict(model.attrs)
        )
        started = time.perf_counter()
        with library_output() as output, _accuracy.candidates_as_models(), _nncf_shared.shared(ctx.cache_dir, model.digest) as sharing:
            quantized = self._quantize(source, items, validator, subset_size)
        notes.extend(sharing.notes())
        if validator.error is not None:
            raise validator.error  # NNCF swallowed it (and fell back to a mode this pass does not run)
        seconds = round(time.perf_counter() - started, 3)
        check_outputs_kept(source.model, quantized)
        reverted_none = len(validator.measured) > 1 and set(_ir.quantized_op_names(quantized)) == validator.measured[1].quantized_ops
        if reverted_none:  # the first quantization met the bar: written as nncf_quantize writes it
            _nncf.as_plain_quantization(quantized)
        _nncf.write(quantized, ctx, source.hint)
        output_model = ModelArtifact.from_folder("openvino", Path(ctx.output_dir), attrs=model.attrs)
        final = validator.measure_value(output_model)  # the written model, INT8 weights and all
        details = self._details(source, quantized, validator, final, output, notes)
        details.update(
            {
                "preset": cfg.preset,
                "model_type": cfg.model_type,
                "subset_size": subset_size,
                "calibration_samples": len(items),
                "inference_precision_hint": source.hint,
                "written_as_plain_quantization": reverted_none,
                "calibration_shared": bool(sharing.served),
                "library_warnings": output.lines(),
                "seconds": seconds,
            }
        )
        return PassResult(model=output_model, details=details, notes=notes)

    def _quantize(self, source: Any, items: list[Any], validator: Any, subset_size: int) -> Any:
        import nncf
        from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

        from passes.openvino import _nncf

        cfg = self.config
        try:
            return nncf.quantize_with_accuracy_control(
                source.model,
                nncf.Dataset(items),
                nncf.Dataset(items[: cfg.validation_samples]),
                validator,
                max_drop=cfg.max_drop,
                drop_type=nncf.DropType.ABSOLUTE if cfg.drop_type == "absolute" else nncf.DropType.RELATIVE,
                **_nncf.quantize_arguments(cfg, subset_size, advanced="advanced_quantization_parameters"),
                advanced_accuracy_restorer_parameters=AdvancedAccuracyRestorerParameters(
                    max_num_iterations=cfg.max_num_iterations, num_ranking_workers=1
                ),
            )
        except Exception as error:
            if validator.error is not None and validator.error is not error:
                raise validator.error from error
            raise

    def _details(self, source: Any, quantized: Any, validator: Any, final: float, output: Any, notes: list[str]) -> dict[str, Any]:
        from passes.openvino import _accuracy, _ir, _nncf

        cfg = self.config
        measured = validator.measured
        first_quantized = measured[1].quantized_ops if len(measured) > 1 else set()
        final_quantized = set(_ir.quantized_op_names(quantized))
        reverted = sorted(first_quantized - final_quantized)
        report = _accuracy.nncf_report([m.message for m in output.messages if m.source.startswith("nncf")])
        initial = measured[0].value if measured else None
        drop = None if initial is None else (initial - final if cfg.metric_goal == "max" else final - initial)
        if drop is not None and cfg.drop_type == "relative" and initial:
            drop /= initial
        if drop is not None and drop > cfg.max_drop:
            notes.append(
                f"{cfg.validation}.{cfg.metric} dropped by {drop:.4g} ({cfg.drop_type}), more than max_drop {cfg.max_drop:g}: "
                "NNCF could not restore it within max_num_iterations"
            )
        details: dict[str, Any] = {
            **source.facts,
            **_nncf.quantization_facts(source, quantized),
            "validation": cfg.validation,
            "metric": cfg.metric,
            "metric_goal": cfg.metric_goal,
            "initial_metric": initial,
            "quantized_metric": measured[1].value if len(measured) > 1 else None,
            "final_metric": final,
            "drop": drop,
            "max_drop": cfg.max_drop,
            "drop_type": cfg.drop_type,
            "quantized_op_count_before_restoring": len(first_quantized),
            "quantized_op_count": len(final_quantized),
            "reverted_ops": len(reverted),
            "reverted_op_names": reverted[:50],
            "iterations": report["iterations"],
            "models_measured": len(measured) + 1,
            "validation_calls": validator.calls,
            "nncf_log": report["log"],
        }
        return details
