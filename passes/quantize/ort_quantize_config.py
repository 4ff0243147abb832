"""The options of ``ort_quantize`` (one ``Config`` for both modes; see ``passes.quantize.ort_quantize``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, JsonValue, TypeAdapter, model_validator

from engine.core import PassConfig
from engine.core.refs import DatasetRef

#: options only static mode reads; given with mode dynamic they are an error
STATIC_ONLY = (
    "quant_format",
    "calibration",
    "calibration_method",
    "calibration_samples",
    "calibration_batch_size",
    "activation_type",
    "percentile",
    "num_bins",
    "symmetric_activation",
    "calib_moving_average",
)
#: what static mode uses for these when they are not given (filled into the config, so into the key)
STATIC_DEFAULTS: dict[str, Any] = {
    "quant_format": "QDQ",
    "calibration_method": "MinMax",
    "calibration_batch_size": 1,
    "activation_type": "quint8",
}
#: typed options and the onnxruntime extra_options key each one sets (giving both is an error)
TYPED_EXTRA_OPTIONS = {
    "symmetric_activation": "ActivationSymmetric",
    "symmetric_weight": "WeightSymmetric",
    "calib_moving_average": "CalibMovingAverage",
    "percentile": "CalibPercentile",
}
#: extra_options of quantize_static this pass cannot honour, because it calibrates by itself
STATIC_UNSUPPORTED_EXTRA = {
    "SmoothQuant": "SmoothQuant needs neural-compressor's ONNX adaptor and rewrites the model before calibrating; it is not supported",
    "CalibStridedMinMax": "use extra_options.CalibMaxIntermediateOutputs to bound the calibration's memory instead",
}
#: activation and weight data types; the 16-bit ones are static QDQ only (onnxruntime's QOperator
#: kernels are 8-bit; quantize_static writes 16-bit QuantizeLinear/DequantizeLinear at opset 21)
ActivationType = Literal["quint8", "qint8", "quint16", "qint16"]
WeightType = Literal["qint8", "quint8", "qint16", "quint16"]
SIXTEEN_BIT = ("quint16", "qint16")
#: the smallest histogram each histogram calibrator works with (onnxruntime 1.31 fails below)
MIN_BINS = {"Entropy": 128, "Distribution": 512}


def with_static_defaults(data: Any, defaults: dict[str, Any], mode: str | None = None) -> Any:
    """A before-validator's input with ``defaults`` filled in where missing or null, when its mode
    is static (``mode``: the mode when it names none), so the job key names every value used."""
    if isinstance(data, dict) and data.get("mode", mode) == "static":
        return {**data, **{name: value for name, value in defaults.items() if data.get(name) is None}}
    return data


class OrtQuantizeConfig(PassConfig):
    """Options of ort_quantize: a union on ``mode``. ``OrtQuantizeConfig(...)`` and
    ``OrtQuantizeConfig.model_validate(...)`` give a ``DynamicQuantizeConfig`` (mode dynamic, the
    default) or a ``StaticQuantizeConfig`` (mode static), and the JSON schema is their
    discriminated union. This class holds the fields of both (static-only options default to None),
    so a config's JSON, and with it every job key, is the same in either form; subclasses that
    take both modes (ort_quantize_accuracy) extend it directly."""

    def __new__(cls, *args: Any, **data: Any) -> OrtQuantizeConfig:
        return super().__new__(_variant(cls, data))

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Any:
        variant = _variant(cls, obj)
        if variant is not cls:
            return variant.model_validate(obj, *args, **kwargs)
        return super().model_validate(obj, *args, **kwargs)

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if cls is not OrtQuantizeConfig:
            return super().model_json_schema(*args, **kwargs)
        union = TypeAdapter(Annotated[DynamicQuantizeConfig | StaticQuantizeConfig, Field(discriminator="mode")])
        return {"title": cls.__name__, **union.json_schema(*args, **kwargs)}

    mode: Literal["dynamic", "static"] = Field(
        "dynamic",
        description=(
            "dynamic: activations are quantized at run time; no data needed. "
            "static: activations are quantized with ranges calibrated on the dataset named by `calibration`."
        ),
    )
    # --- shared by both modes -------------------------------------------------------------------
    weight_type: WeightType = Field(
        "qint8",
        description=(
            "Data type of the quantized weights: signed (qint8) or unsigned (quint8) 8-bit; qint16 / quint16 in static QDQ "
            "only. Dynamic mode always quantizes activations to quint8."
        ),
    )
    per_channel: bool = Field(
        False,
        description="One scale and zero point per output channel of each weight instead of one per tensor. Usually more accurate (all-MiniLM-L6-v2, dynamic: cosine 0.993 vs 0.960).",
    )
    reduce_range: bool = Field(
        False,
        description="Quantize weights to 7 bits. Can help accuracy on CPUs without VNNI (saturation in the u8s8 dot product); rarely useful with VNNI.",
    )
    op_types_to_quantize: list[str] | None = Field(
        None,
        description=(
            "Op types to quantize. null = every op type the mode's quantizer supports. Dynamic (onnxruntime 1.31): Conv, "
            "MatMul, Attention, LSTM, Gather, Transpose, EmbedLayerNormalization; Gemm nodes are rewritten to MatMul first, "
            "so list MatMul for them. Static: the union of onnxruntime's QOperator and QDQ registries (MatMul, Conv, Gemm, "
            "Add, Mul, Relu, Softmax, Gather, Transpose, Reshape...); QOperator accepts only its registry's op types, QDQ "
            "wraps any op type in QuantizeLinear/DequantizeLinear. On transformers, static QDQ of every op type destroys "
            "accuracy (the attention-mask Add): list MatMul only. If the model has none of the listed op types the pass fails."
        ),
    )
    nodes_to_quantize: list[str] | None = Field(
        None,
        description="Names of the only nodes to quantize (null = every node of the quantized op types). Names are those of the input model; an unknown name is an error.",
    )
    nodes_to_exclude: list[str] = Field(
        default_factory=list,
        description="Names of nodes to keep in float (for instance the most sensitive MatMuls). Names are those of the input model; an unknown name is an error.",
    )
    preprocess: bool = Field(
        True,
        description=(
            "Run onnxruntime's quant_pre_process first (graph optimization at BASIC level + shape inference; symbolic shape "
            "inference skipped). When nodes are named in nodes_to_quantize / nodes_to_exclude, only shape inference runs, so "
            "the names stay valid. If preprocessing fails, the model is quantized as given and a note says so."
        ),
    )
    symmetric_weight: bool | None = Field(
        None,
        description="Symmetric weight quantization (zero point at 0); onnxruntime's WeightSymmetric. null = onnxruntime's default: symmetric for qint8 weights, not for quint8.",
    )
    extra_options: dict[str, JsonValue] = Field(
        default_factory=dict,
        description=(
            "Passed to onnxruntime as extra_options (see quantize_dynamic's / quantize_static's documentation), e.g. "
            "MatMulConstBOnly (default true in dynamic mode, false in static mode), EnableSubgraph, AddQDQPairToWeight, "
            "DedicatedQDQPair, QDQOpTypePerChannelSupportToAxis, QuantizeBias, QDQKeepRemovableActivations, "
            "CalibTensorRangeSymmetric, CalibMovingAverageConstant, CalibMaxIntermediateOutputs (static: bounds calibration "
            "memory for MinMax). DefaultTensorType defaults to 1 (FLOAT) so fused models with com.microsoft ops quantize; "
            "a TensorProto type name such as 'FLOAT' is accepted too. Unknown keys are ignored by onnxruntime. Options that "
            "have a typed field here (ActivationSymmetric, WeightSymmetric, CalibMovingAverage, CalibPercentile) must be "
            "given as that field."
        ),
    )
    # --- static mode only ------------------------------------------------------------------------
    quant_format: Literal["QDQ", "QOperator"] | None = Field(
        None,
        description="Static only (default QDQ). QDQ: QuantizeLinear/DequantizeLinear around float ops, which onnxruntime fuses into integer kernels (recommended on CPU). QOperator: QLinearMatMul, QLinearConv... directly.",
    )
    calibration: DatasetRef | None = Field(
        None,
        min_length=1,
        description="Static only, required: the name of a workflow dataset (under data:) whose samples calibrate the activation ranges. Only the inputs the model declares are fed; integer and float widths are cast to the model's.",
    )
    calibration_method: Literal["MinMax", "Entropy", "Percentile", "Distribution"] | None = Field(
        None,
        description=(
            "Static only (default MinMax). How ranges are derived from the calibration data: MinMax (observed min and max), "
            "Entropy (threshold minimizing KL divergence of the histogram), Percentile (the given percentile of |x|), "
            "Distribution (symmetric ranges from a histogram; meant for float8)."
        ),
    )
    calibration_samples: int | None = Field(
        None,
        ge=1,
        description="Static only: calibrate on the first N samples of the dataset (null = all). Fewer samples than asked is an error.",
    )
    calibration_batch_size: int | None = Field(
        None, ge=1, description="Static only (default 1): samples per calibration run. The model must accept that batch size."
    )
    activation_type: ActivationType | None = Field(
        None,
        description=(
            "Static only (default quint8): data type of the quantized activations. quint8 activations with qint8 weights (U8S8) "
            "is the fast path on x86 CPUs and measured better than S8S8 here. quint16 / qint16 (QDQ only) are what NPUs such as "
            "Qualcomm's HTP run (A16W8): far closer to float, but onnxruntime's CPU provider runs them as float ops between "
            "QuantizeLinear/DequantizeLinear pairs, so they are no faster there."
        ),
    )
    percentile: float | None = Field(
        None,
        gt=0,
        le=100,
        description="Static only, Percentile calibration: the percentile of the values the range keeps (onnxruntime's default 99.999).",
    )
    num_bins: int | None = Field(
        None,
        ge=2,
        description=(
            "Static only, histogram calibrations: histogram bins (onnxruntime's defaults: Entropy 128, at least 128; Percentile "
            "2048; Distribution 2048, at least 512). At Entropy's default of 128 bins (= its 128 quantized bins) there is a single "
            "candidate threshold, so Entropy gives the MinMax range; more bins make it search (2048 bins: 48 s on MiniLM's 96 "
            "MatMul tensors, and a lower fidelity than MinMax there)."
        ),
    )
    symmetric_activation: bool | None = Field(
        None,
        description="Static only: symmetric activation quantization (zero point at the middle); onnxruntime's ActivationSymmetric, default false.",
    )
    calib_moving_average: bool | None = Field(
        None,
        description="Static only, MinMax calibration: range = moving average of each batch's min and max instead of the overall min and max (onnxruntime's CalibMovingAverage, default false; the constant is extra_options.CalibMovingAverageConstant).",
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_static_defaults(cls, data: Any) -> Any:
        return with_static_defaults(data, STATIC_DEFAULTS)

    @model_validator(mode="after")
    def _check(self) -> OrtQuantizeConfig:
        if self.op_types_to_quantize is not None and not self.op_types_to_quantize:
            raise ValueError("op_types_to_quantize is an empty list; use null for the default op types")
        if self.nodes_to_quantize is not None and not self.nodes_to_quantize:
            raise ValueError("nodes_to_quantize is an empty list; use null to quantize every node of the quantized op types")
        if self.nodes_to_quantize:
            both = sorted(set(self.nodes_to_quantize) & set(self.nodes_to_exclude))
            if both:
                raise ValueError(f"nodes both in nodes_to_quantize and nodes_to_exclude: {', '.join(both)}")
        for typed, extra in TYPED_EXTRA_OPTIONS.items():
            if getattr(self, typed) is not None and extra in self.extra_options:
                raise ValueError(f"{typed} and extra_options.{extra} set the same onnxruntime option; give only {typed}")
        if self.mode == "dynamic":
            if self.weight_type in SIXTEEN_BIT:
                raise ValueError(
                    f"weight_type {self.weight_type} applies to mode static (QDQ) only; dynamic mode quantizes weights to 8 bits"
                )
            given = [name for name in STATIC_ONLY if getattr(self, name) is not None]
            if given:
                raise ValueError(
                    f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to mode static only, and mode is dynamic: "
                    f"set mode: static or remove {'it' if len(given) == 1 else 'them'}"
                )
            return self
        if self.calibration is None:
            raise ValueError(
                "mode static needs calibration: the name of a workflow dataset (under data:) whose samples calibrate the activation ranges"
            )
        sixteen = [name for name in ("activation_type", "weight_type") if getattr(self, name) in SIXTEEN_BIT]
        if sixteen and self.quant_format != "QDQ":
            raise ValueError(f"16-bit {' and '.join(sixteen)} need quant_format QDQ; onnxruntime's QOperator kernels are 8-bit")
        if self.activation_type == "qint8" and self.weight_type == "quint8":
            raise ValueError("activation_type qint8 with weight_type quint8 is not supported by onnxruntime; use weight_type qint8")
        for name, reason in STATIC_UNSUPPORTED_EXTRA.items():
            if name in self.extra_options:
                raise ValueError(f"extra_options.{name} is not supported in mode static: {reason}")
        least = MIN_BINS.get(self.calibration_method or "")
        if least is not None and self.num_bins is not None and self.num_bins < least:
            raise ValueError(f"num_bins {self.num_bins} is below {least}, the fewest {self.calibration_method} calibration works with")
        return self


_MODE = OrtQuantizeConfig.model_fields["mode"].description


def _described(name: str) -> str | None:
    return OrtQuantizeConfig.model_fields[name].description


class DynamicQuantizeConfig(OrtQuantizeConfig):
    """ort_quantize in mode dynamic: the static-only options stay unset (None)."""

    mode: Literal["dynamic"] = Field("dynamic", description=_MODE)


class StaticQuantizeConfig(OrtQuantizeConfig):
    """ort_quantize in mode static: the options static mode fills in are never None."""

    mode: Literal["static"] = Field(description=_MODE)
    quant_format: Literal["QDQ", "QOperator"] = Field("QDQ", description=_described("quant_format"))
    calibration_method: Literal["MinMax", "Entropy", "Percentile", "Distribution"] = Field(
        "MinMax", description=_described("calibration_method")
    )
    calibration_batch_size: int = Field(1, ge=1, description=_described("calibration_batch_size"))
    activation_type: ActivationType = Field("quint8", description=_described("activation_type"))


_VARIANTS: dict[Any, type[OrtQuantizeConfig]] = {
    None: DynamicQuantizeConfig,
    "dynamic": DynamicQuantizeConfig,
    "static": StaticQuantizeConfig,
}


def _variant(cls: type[OrtQuantizeConfig], data: Any) -> type[OrtQuantizeConfig]:
    """The class that validates ``data``: the variant its mode names when ``cls`` is the union
    (an unknown mode is left to the union's own field check, which lists both)."""
    if cls is not OrtQuantizeConfig or not isinstance(data, dict):
        return cls
    return _VARIANTS.get(data.get("mode"), cls)
