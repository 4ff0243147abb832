"""The options of ``ort_quantize_accuracy``: ``ort_quantize``'s (static by default), the bar, and
how the search for the fewest nodes in float that clear it runs (passes.quantize.ort_quantize_accuracy)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from engine.core.refs import EvaluationRef
from passes.quantize.ort_quantize import STATIC_DEFAULTS, OrtQuantizeConfig
from passes.quantize.ort_quantize_config import with_static_defaults


class OrtQuantizeAccuracyConfig(OrtQuantizeConfig):
    """ort_quantize's options (static by default) plus the bar and how to reach it."""

    mode: Literal["dynamic", "static"] = Field(
        "static",
        description="static (default): activations quantized with ranges calibrated on `calibration`; dynamic: at run time (only weight noise ranks the nodes then).",
    )
    validation: EvaluationRef = Field(
        description="Id of the workflow evaluation that judges each model (an entry of `evaluate:`, e.g. fidelity)."
    )
    metric: str = Field(description="The value of that evaluation compared with the bar, e.g. cosine_mean.")
    min: float | None = Field(None, description="The bar: the metric must be at least this (e.g. 0.99 for cosine_mean).")
    max: float | None = Field(None, description="The bar: the metric must be at most this (e.g. 0.05 for max_abs_error).")
    max_iterations: int = Field(
        10,
        ge=1,
        description=(
            "Rungs of the ladder the search may measure, the first (nothing more in float) included: rung i leaves the first i "
            "steps of fallbacks in float. `search: linear` measures them in order, so at most this many models; bisect fewer."
        ),
    )
    search: Literal["bisect", "linear"] = Field(
        "bisect",
        description=(
            "How the rungs are searched for the lowest one that clears the bar, once the first model missed it; rung 1 (the "
            "noisiest nodes in float) is measured next either way. bisect: then halving the rungs left at each model measured "
            "(8 rungs: 5 models at most, the first included), taking a model with more nodes in float to be no further from the "
            "bar than one with fewer, as the ranking intends. linear: one rung after another, as many models as the bar needs."
        ),
    )
    nodes_per_step: int = Field(
        4, ge=1, description="fallback nodes: how many more nodes each rung leaves in float (at least; a tensor's nodes go together)."
    )
    fallback: Literal["nodes", "op_types"] = Field(
        "nodes",
        description="nodes: the nodes around the noisiest quantized tensors fall back; op_types: all nodes of the op type adding the most noise, one op type per rung.",
    )
    sensitivity: Literal["activation_error", "weight_error"] | None = Field(
        None,
        description=(
            "How nodes are ranked. activation_error (static): the SQNR each quantized activation and weight adds, measured with "
            "onnxruntime's QDQ debugging tools on calibration samples (QOperator: on a QDQ twin). weight_error: the weights' SQNR "
            "only (the only one in dynamic mode). null: activation_error in static mode, weight_error in dynamic mode."
        ),
    )
    sensitivity_samples: int = Field(
        4, ge=1, description="activation_error: calibration samples run to measure the noise (fewer if the dataset has fewer)."
    )
    on_failure: Literal["best", "error"] = Field(
        "best",
        description="When no model clears the bar within max_iterations: best outputs the best one with a note; error fails with the trajectory.",
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_static_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = with_static_defaults({"mode": "static", **data}, STATIC_DEFAULTS)
        if data.get("sensitivity") is None:
            data["sensitivity"] = "activation_error" if data["mode"] == "static" else "weight_error"
        return data

    @model_validator(mode="after")
    def _check_bar(self) -> OrtQuantizeAccuracyConfig:
        if self.min is None and self.max is None:
            raise ValueError("give the bar: min (the metric must be at least this), max (at most this), or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}: no value can clear that bar")
        if self.sensitivity == "activation_error" and self.mode == "dynamic":
            raise ValueError(
                "sensitivity activation_error needs mode static (a dynamic model has no calibrated activations); use weight_error"
            )
        return self

    def quantize_options(self, excluded: list[str]) -> OrtQuantizeConfig:
        """ort_quantize's config for one iteration: these options, these nodes in float, no preprocessing."""
        given = self.model_dump(include=set(OrtQuantizeConfig.model_fields))
        return OrtQuantizeConfig(**{**given, "preprocess": False, "nodes_to_exclude": excluded})
