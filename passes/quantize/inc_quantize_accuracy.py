"""INT8 quantization with Intel Neural Compressor's accuracy-driven tuning, judged by one of the
workflow's own evaluators, in INC's own isolated environment (``passes.quantize._inc``).

``quantization.fit`` gets an evaluation function: INC measures the float model first (its
baseline), then quantizes with one configuration after another, as its tuning ``strategy`` orders
them (``basic``: the default configuration, then op types and ops falling back to float by
sensitivity; ``mse`` / ``mse_v2``, ``bayesian``, ``exhaustive``, ``random``...), until a model
loses at most ``tolerable_loss`` (``relative`` or ``absolute``) against the baseline or
``max_trials`` models were tried. Each model INC asks about is written into the job's work folder
and measured with ``ctx.measure(validation, model)``: the workflow's evaluation on the step's
target, against the step's input model, exactly as ``ort_quantize_accuracy`` and
``nncf_quantize_accuracy`` judge theirs. Values are cached by model digest.

When no model meets the bar INC returns nothing; ``on_failure: best`` then outputs the best model
it tried (with a note) and ``error`` fails with the trajectory.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from engine.core import Categorical, KilnError, ModelArtifact, PassContext, PassResult
from engine.core.evaluator import MetricResult
from engine.core.refs import EvaluationRef
from passes.common.library_logs import distinct
from passes.common.onnx_io import save_onnx
from passes.common.pass_io import open_onnx_input
from passes.quantize import _inc, isolated_output
from passes.quantize.onnx_facts import file_bytes, new_quantized_ops, op_counts

#: INC's tuning strategies that work on its ONNX Runtime adaptor
STRATEGIES = ("basic", "auto", "mse", "mse_v2", "bayesian", "exhaustive", "random")


class IncQuantizeAccuracyConfig(_inc.IncOptions):
    """inc_quantize's options (static by default) plus the evaluation, the bar and the tuning."""

    mode: Literal["dynamic", "static"] = Field(
        "static", description="static (default): calibrated on `calibration`; dynamic: activations quantized at run time."
    )
    validation: EvaluationRef = Field(description="Id of the workflow evaluation that judges each model (an entry of `evaluate:`).")
    metric: str = Field(description="The value of that evaluation INC tunes for, e.g. top1 (accuracy) or cosine_mean (fidelity).")
    metric_goal: Literal["max", "min"] = Field("max", description="max: higher is better (top1, cosine_mean); min: lower is better.")
    tolerable_loss: float = Field(0.01, ge=0, description="The largest loss against the float model's value INC accepts.")
    loss_type: Literal["relative", "absolute"] = Field(
        "relative", description="relative: (baseline - value) / baseline; absolute: baseline - value (INC's accuracy criterion)."
    )
    strategy: Literal["basic", "auto", "mse", "mse_v2", "bayesian", "exhaustive", "random"] = Field(
        "basic", description="INC's tuning strategy: the order in which it tries configurations."
    )
    max_trials: int = Field(20, ge=1, description="Most quantized models INC tries (the baseline not counted).")
    tuning_timeout_s: int = Field(0, ge=0, description="INC's tuning timeout in seconds; 0 stops at the first model that meets the bar.")
    quant_level: Literal["auto", 0, 1] = Field(
        "auto", description="INC's quant_level: 1 starts from everything quantized and falls back; 0 starts conservative; auto: 1 then 0."
    )
    on_failure: Literal["best", "error"] = Field(
        "best", description="When no model meets the bar: best outputs the best model INC tried, with a note; error fails."
    )


@dataclass
class Trial:
    """One model INC asked about: its digest, value, folder, and how long measuring it took."""

    digest: str
    value: float
    folder: Path
    seconds: float
    baseline: bool


@dataclass
class Judge:
    """INC's evaluation function: write the model, measure it with the workflow's evaluator."""

    measure: Callable[[str, ModelArtifact], MetricResult]
    evaluation: str
    metric: str
    workdir: Path
    attrs: dict[str, Any]
    trials: list[Trial] = field(default_factory=list)
    calls: int = 0
    error: BaseException | None = None

    def __call__(self, model: Any) -> float:
        self.calls += 1
        try:
            return self._value(model)
        except BaseException as error:
            self.error = self.error or error  # INC may swallow it: the pass raises it afterwards
            raise

    def _value(self, model: Any) -> float:
        import onnx

        proto = model if isinstance(model, onnx.ModelProto) else model.model
        copy = onnx.ModelProto()
        copy.CopyFrom(proto)
        folder = self.workdir / "trials" / f"model_{len(self.trials)}"
        shutil.rmtree(folder, ignore_errors=True)
        save_onnx(copy, folder)
        artifact = ModelArtifact.from_folder("onnx", folder, attrs=self.attrs)
        known = next((t for t in self.trials if t.digest == artifact.digest), None)
        if known is not None:
            shutil.rmtree(folder, ignore_errors=True)
            return known.value
        started = time.perf_counter()
        values = self.measure(self.evaluation, artifact).values
        if self.metric not in values:
            raise KilnError(f"evaluation '{self.evaluation}' gives no '{self.metric}'; it gives: {', '.join(sorted(values))}")
        value = float(values[self.metric])
        self.trials.append(Trial(artifact.digest, value, folder, round(time.perf_counter() - started, 3), baseline=not self.trials))
        return value


class IncQuantizeAccuracy(_inc.IncPass):
    name = "inc_quantize_accuracy"
    summary = "Intel Neural Compressor's accuracy-driven INT8 tuning, judged by a workflow evaluation, in its own environment."
    version = "1"
    target_dependent = True
    search_space = {
        "strategy": Categorical(("basic", "mse_v2", "bayesian")),
        "calibration_method": Categorical(("minmax", "kl", "percentile")),
        "per_channel": Categorical((False, True)),
    }

    Config = IncQuantizeAccuracyConfig
    config: IncQuantizeAccuracyConfig

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        cfg = self.config
        if ctx.measure is None:
            raise KilnError(f"step '{ctx.step_id}' needs the engine's measure function to run evaluation '{cfg.validation}'")
        opened = open_onnx_input(model, ctx)
        source = _inc.readable_input(opened.source, opened.workdir)
        notes: list[str] = []
        feed = _inc.calibration_feed(cfg, ctx, opened.graph, notes)
        judge = Judge(ctx.measure, cfg.validation, cfg.metric, opened.workdir, dict(model.attrs))
        started = time.perf_counter()
        with _inc.inc_session(opened.workdir) as warnings:
            result = self._fit(source, feed, judge)
        seconds = round(time.perf_counter() - started, 3)
        if judge.error is not None:
            raise judge.error
        if not judge.trials:
            raise KilnError("Intel Neural Compressor never called the evaluation function; its log is in the job's log")
        baseline = judge.trials[0].value
        met = result is not None
        if met:
            save_onnx(result.model, Path(ctx.output_dir))
        else:
            chosen = self._best(judge.trials, baseline)
            shutil.copytree(chosen.folder, ctx.output_dir, dirs_exist_ok=True)
            notes.append(self._shortfall(judge.trials, chosen, baseline))
        output = ModelArtifact.from_folder("onnx", Path(ctx.output_dir), attrs=model.attrs)
        final = next((t for t in judge.trials if t.digest == output.digest), None)
        details = self._details(judge, baseline, final, met, seconds, distinct(warnings))
        import onnx

        written = onnx.load(str(output.model_file), load_external_data=False)
        details["quantized_ops"] = new_quantized_ops(op_counts(opened.graph), op_counts(written))
        details["bytes_before"], details["bytes_after"] = file_bytes(model.model_file), file_bytes(output.model_file)
        if feed is not None:
            details["calibration"] = isolated_output.calibration_details(cfg.calibration or "", feed, method=cfg.calibration_method)
        return PassResult(model=output, details=details, notes=notes)

    def _fit(self, source: Path, feed: Any, judge: Judge) -> Any:
        from neural_compressor import PostTrainingQuantConfig, quantization
        from neural_compressor.config import AccuracyCriterion, TuningCriterion

        cfg = self.config
        conf = PostTrainingQuantConfig(
            **_inc.conf_arguments(cfg, feed.samples if feed else None),
            quant_level=cfg.quant_level,
            tuning_criterion=TuningCriterion(strategy=cfg.strategy, max_trials=cfg.max_trials, timeout=cfg.tuning_timeout_s),
            accuracy_criterion=AccuracyCriterion(
                higher_is_better=cfg.metric_goal == "max", criterion=cfg.loss_type, tolerable_loss=cfg.tolerable_loss
            ),
        )
        loader = _inc.CalibrationLoader(feed) if feed is not None else None
        return quantization.fit(str(source), conf, calib_dataloader=loader, eval_func=judge)

    def _loss(self, value: float, baseline: float) -> float:
        cfg = self.config
        loss = baseline - value if cfg.metric_goal == "max" else value - baseline
        return loss / abs(baseline) if cfg.loss_type == "relative" and baseline else loss

    def _best(self, trials: list[Trial], baseline: float) -> Trial:
        quantized = [t for t in trials if not t.baseline]
        if not quantized:
            raise KilnError("Intel Neural Compressor measured no quantized model (only the float baseline); its log is in the job's log")
        return min(quantized, key=lambda t: self._loss(t.value, baseline))

    def _trajectory(self, trials: list[Trial], baseline: float) -> list[dict[str, Any]]:
        cfg = self.config
        return [
            {
                "trial": index,
                "baseline": t.baseline,
                "metric": t.value,
                "loss": round(self._loss(t.value, baseline), 6),
                "met": t.baseline or self._loss(t.value, baseline) <= cfg.tolerable_loss,
                "digest": t.digest,
                "seconds": t.seconds,
            }
            for index, t in enumerate(trials)
        ]

    def _shortfall(self, trials: list[Trial], chosen: Trial, baseline: float) -> str:
        """The note for a tuning that never met the bar; raises instead when ``on_failure`` is error."""
        cfg = self.config
        steps = "; ".join(f"{cfg.metric} {t.value:.6g}" for t in trials if not t.baseline)
        bar = f"{cfg.loss_type} loss <= {cfg.tolerable_loss:g} against the float model's {baseline:.6g}"
        if cfg.on_failure == "error":
            raise KilnError(f"no model INC tried met the bar ({bar}) within max_trials {cfg.max_trials}: {steps}")
        return f"no model INC tried met the bar ({bar}) within max_trials {cfg.max_trials}; the output is the best one tried: {cfg.metric} {chosen.value:.6g}"

    def _details(
        self, judge: Judge, baseline: float, final: Trial | None, met: bool, seconds: float, warnings: list[str]
    ) -> dict[str, Any]:
        cfg = self.config
        return {
            "mode": cfg.mode,
            "quant_format": cfg.quant_format,
            "strategy": cfg.strategy,
            "validation": cfg.validation,
            "metric": cfg.metric,
            "metric_goal": cfg.metric_goal,
            "bar": {"tolerable_loss": cfg.tolerable_loss, "loss_type": cfg.loss_type},
            "bar_met": met,
            "baseline_metric": baseline,
            "final_metric": final.value if final is not None else None,
            "final_loss": round(self._loss(final.value, baseline), 6) if final is not None else None,
            "trials": len([t for t in judge.trials if not t.baseline]),
            "evaluation_calls": judge.calls,
            "trajectory": self._trajectory(judge.trials, baseline),
            "versions": _inc.versions(),
            "inc_warnings": warnings,
            "seconds": seconds,
        }
