"""INT8 quantization of an ONNX model with onnxruntime's own quantizer (``onnxruntime.quantization``).

Two modes, chosen by ``mode``:

- **dynamic** (default): weights are quantized ahead of time, activations at run time
  (``DynamicQuantizeLinear`` → ``MatMulInteger`` / ``ConvInteger`` → rescale). No data needed.
- **static**: weights and activations are quantized ahead of time, activations with scales and
  zero points fixed from ranges measured on a calibration dataset (``calibration``: the name of a
  workflow dataset). The output is either QDQ (``QuantizeLinear`` / ``DequantizeLinear`` pairs
  around float ops, which onnxruntime fuses into integer kernels) or QOperator (``QLinearMatMul``,
  ``QLinearConv``... directly).

Steps, all inside the step's workdir:

1. optionally ``quant_pre_process`` (onnxruntime's optimizer at BASIC level + ONNX shape
   inference; symbolic shape inference is skipped, it fails on transformer exports);
2. static only: the activation ranges, from the pass's cache folder when the same model, data,
   op types and calibration options were calibrated before, else from onnxruntime's calibrator
   (``create_calibrator`` + ``collect_data`` + ``compute_data``), then stored in the cache (see
   ``passes.quantize.calibration``);
3. ``quantize_dynamic``, or ``quantize_static`` given those ranges as its calibration cache;
4. drop the opset imports the optimizer added but no node uses, and save with ``save_onnx``.

Options that apply to one mode only are fields of the one ``Config`` that default to None and are
rejected, with the option's name, when given with the other mode. Static mode fills its defaults
in (quant_format QDQ, calibration_method MinMax, calibration_batch_size 1, activation_type quint8),
so the job key shows the values used.

onnx and onnxruntime are imported inside functions, never at module level: the engine imports
this module when it validates a workflow, only to read ``Config``, and that must stay fast.
"""

from __future__ import annotations

import inspect
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, JsonValue, model_validator

from engine.core import Categorical, KilnError, MissingDependency, ModelArtifact, PassConfig, PassContext, PassResult
from passes.common.graph_tools import runtime_loadable
from passes.common.library_logs import LibraryMessage, capture_library_logs, distinct
from passes.common.onnx_io import EXTERNAL_DATA_THRESHOLD, OnnxPass, save_onnx
from passes.common.pass_io import check_providers
from passes.quantize.onnx_facts import (
    file_bytes,
    initializer_bytes,
    iter_nodes,
    new_quantized_ops,
    node_names,
    op_counts,
    prune_unused_opsets,
    unquantized_nodes,
)

if TYPE_CHECKING:
    import onnx

    from passes.quantize.calibration import CalibrationFeed

#: the logger ``quant_pre_process`` reports its swallowed optimizer failure on
_PREPROCESS_LOGGER = "onnxruntime.quantization.shape_inference"
#: the quantizers' advice when the input was not preprocessed: noise when the user chose so
_PREPROCESS_ADVICE = "Please consider"

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
#: the smallest histogram each histogram calibrator works with (onnxruntime 1.31 fails below)
MIN_BINS = {"Entropy": 128, "Distribution": 512}


class OrtQuantizeConfig(PassConfig):
    """Options of ort_quantize. One class for both modes: static-only options default to None."""

    mode: Literal["dynamic", "static"] = Field(
        "dynamic",
        description=(
            "dynamic: activations are quantized at run time; no data needed. "
            "static: activations are quantized with ranges calibrated on the dataset named by `calibration`."
        ),
    )
    # --- shared by both modes -------------------------------------------------------------------
    weight_type: Literal["qint8", "quint8"] = Field(
        "qint8",
        description="Data type of the quantized weights: signed (qint8) or unsigned (quint8) 8-bit. Dynamic mode always quantizes activations to quint8.",
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
    calibration: str | None = Field(
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
    activation_type: Literal["quint8", "qint8"] | None = Field(
        None,
        description="Static only (default quint8): data type of the quantized activations. quint8 activations with qint8 weights (U8S8) is the fast path on x86 CPUs and measured better than S8S8 here.",
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
        if isinstance(data, dict) and data.get("mode") == "static":
            data = dict(data)
            for name, value in STATIC_DEFAULTS.items():
                if data.get(name) is None:
                    data[name] = value
        return data

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
        if self.activation_type == "qint8" and self.weight_type == "quint8":
            raise ValueError("activation_type qint8 with weight_type quint8 is not supported by onnxruntime; use weight_type qint8")
        for name, reason in STATIC_UNSUPPORTED_EXTRA.items():
            if name in self.extra_options:
                raise ValueError(f"extra_options.{name} is not supported in mode static: {reason}")
        least = MIN_BINS.get(self.calibration_method or "")
        if least is not None and self.num_bins is not None and self.num_bins < least:
            raise ValueError(f"num_bins {self.num_bins} is below {least}, the fewest {self.calibration_method} calibration works with")
        return self


class OrtQuantize(OnnxPass):
    name = "ort_quantize"
    summary = (
        "INT8 quantization with onnxruntime.quantization (dynamic: activations at run time; static: activations calibrated on a dataset)"
    )
    version = "1"
    accepts = ("onnx",)
    produces = "onnx"
    libraries = ("onnx", "onnxruntime")
    dataset_options = ("calibration",)
    search_space = {
        "per_channel": Categorical((False, True)),
        "reduce_range": Categorical((False, True)),
        "weight_type": Categorical(("qint8", "quint8")),
        # static mode only:
        "calibration_method": Categorical(("MinMax", "Entropy", "Percentile")),
        "activation_type": Categorical(("quint8", "qint8")),
        "quant_format": Categorical(("QDQ", "QOperator")),
    }

    Config = OrtQuantizeConfig
    config: OrtQuantizeConfig

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        import onnx

        try:
            from onnxruntime.quantization import registry
        except ImportError as error:
            raise MissingDependency("onnxruntime", "the ort_quantize pass") from error

        cfg = self.config
        static = cfg.mode == "static"
        workdir = Path(ctx.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        notes: list[str] = []

        if static:
            supported = sorted(registry.QLinearOpsRegistry) if cfg.quant_format == "QOperator" else None
            default_op_types = sorted(set(registry.QLinearOpsRegistry) | set(registry.QDQRegistry))
        else:
            supported = default_op_types = sorted(registry.IntegerOpsRegistry)
        _check_op_types(cfg, supported)
        source = runtime_loadable(model.model_file, workdir)
        graph = onnx.load(str(source), load_external_data=False)
        op_types = (
            sorted(set(cfg.op_types_to_quantize))
            if static and cfg.op_types_to_quantize
            else list(cfg.op_types_to_quantize or default_op_types)
        )
        nodes_to_quantize = _node_list(cfg.nodes_to_quantize or [], graph, "nodes_to_quantize")
        nodes_to_exclude = _node_list(cfg.nodes_to_exclude, graph, "nodes_to_exclude")
        _note_absent_op_types(cfg, graph, notes)
        feed = None
        if static:
            from passes.quantize.calibration import model_inputs, prepare_feed

            assert cfg.calibration is not None and cfg.calibration_batch_size is not None  # the config validator sees to it
            dataset = ctx.dataset(cfg.calibration)
            feed = prepare_feed(dataset, cfg.calibration, model_inputs(graph), cfg.calibration_samples, cfg.calibration_batch_size)
        large = file_bytes(source) > EXTERNAL_DATA_THRESHOLD
        quantized_file = workdir / "quantized.onnx"
        timings: dict[str, float] = {}
        calibration: dict[str, Any] = {}

        with capture_library_logs() as messages:
            started = time.perf_counter()
            keep_names = bool(cfg.nodes_to_quantize or cfg.nodes_to_exclude)
            to_quantize, preprocess_state = preprocess_for_quantization(source, workdir, cfg.preprocess, keep_names, large, messages, notes)
            timings["preprocess"] = round(time.perf_counter() - started, 3)
            before = onnx.load(str(to_quantize), load_external_data=False)

            if static:
                assert feed is not None
                started = time.perf_counter()
                ranges_file, calibration = _calibrate(cfg, model, ctx, to_quantize, before, preprocess_state, feed, op_types, large, notes)
                timings["calibrate"] = round(time.perf_counter() - started, 3)
                started = time.perf_counter()
                _quantize_static(cfg, to_quantize, quantized_file, ranges_file, op_types, nodes_to_quantize, nodes_to_exclude, large)
            else:
                started = time.perf_counter()
                _quantize_dynamic(cfg, to_quantize, quantized_file, op_types, nodes_to_quantize, nodes_to_exclude, large)
            timings["quantize"] = round(time.perf_counter() - started, 3)

        output = onnx.load(str(quantized_file))
        dropped_domains = prune_unused_opsets(output)
        counts_in, counts_out = op_counts(before), op_counts(output)
        quantized_ops = new_quantized_ops(counts_in, counts_out)
        unquantized = unquantized_nodes(output, op_types, qdq=static and cfg.quant_format == "QDQ")
        if not quantized_ops:
            notes.append(_explain_nothing_quantized(cfg, before, op_types, unquantized))

        out_file = save_onnx(output, ctx.output_dir)
        warnings = distinct([m for m in messages if not m.message.startswith(_PREPROCESS_ADVICE)])
        details: dict[str, Any] = {
            "mode": cfg.mode,
            "weight_type": cfg.weight_type,
            "activation_type": cfg.activation_type if static else "quint8",
            "per_channel": cfg.per_channel,
            "reduce_range": cfg.reduce_range,
            "op_types_to_quantize": op_types,
            "preprocess": preprocess_state,
            "nodes_before": len(graph.graph.node),
            "nodes_after": len(output.graph.node),
            "quantized_ops": quantized_ops,
            "unquantized_nodes": unquantized,
            "size_bytes_before": file_bytes(model.model_file),
            "size_bytes_after": file_bytes(out_file),
            "initializer_bytes_before": initializer_bytes(graph),
            "initializer_bytes_after": initializer_bytes(output),
            "dropped_opset_domains": dropped_domains,
            "library_warnings": warnings,
            "seconds": timings,
        }
        if static:
            details["quant_format"] = cfg.quant_format
            details["calibration"] = calibration
        ctx.logger.debug("ort_quantize %s: quantized %s, not quantized %s", ctx.step_id, quantized_ops, unquantized)
        return PassResult(model=ModelArtifact.from_folder("onnx", Path(ctx.output_dir), attrs=model.attrs), details=details, notes=notes)


_QUANT_TYPES = {"qint8": "QInt8", "quint8": "QUInt8"}


def _quantize_dynamic(
    cfg: OrtQuantizeConfig,
    to_quantize: Path,
    quantized_file: Path,
    op_types: list[str],
    nodes_to_quantize: list[str],
    nodes_to_exclude: list[str],
    large: bool,
) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(to_quantize),
        str(quantized_file),
        op_types_to_quantize=op_types,
        per_channel=cfg.per_channel,
        reduce_range=cfg.reduce_range,
        weight_type=QuantType[_QUANT_TYPES[cfg.weight_type]],
        nodes_to_quantize=nodes_to_quantize,
        nodes_to_exclude=nodes_to_exclude,
        use_external_data_format=large,
        extra_options=_extra_options(cfg),
    )


def _calibrate(
    cfg: OrtQuantizeConfig,
    model: ModelArtifact,
    ctx: PassContext,
    to_quantize: Path,
    graph: onnx.ModelProto,
    preprocess_state: str,
    feed: CalibrationFeed,
    op_types: list[str],
    large: bool,
    notes: list[str],
) -> tuple[Path, dict[str, Any]]:
    """The activation ranges for ``to_quantize`` (cached or computed), written to the workdir in
    onnxruntime's calibration cache format; and what the calibration details say about them."""
    import onnxruntime

    from passes.quantize.calibration import (
        CACHE_FORMAT,
        calibrator_options,
        clamp_activation_ranges,
        compute_ranges,
        ranges_for,
        store_ranges,
    )

    method = cfg.calibration_method
    assert method is not None
    typed = {
        "percentile": ("percentile", cfg.percentile),
        "num_bins": ("num_bins", cfg.num_bins),
        "moving_average": ("calib_moving_average", cfg.calib_moving_average),
    }
    options, unused = calibrator_options(method, typed, dict(cfg.extra_options))
    if unused:
        notes.append(f"{', '.join(unused)} {'is' if len(unused) == 1 else 'are'} not used by {method} calibration, so ignored")
    workdir = Path(ctx.workdir)
    key_doc = {
        "what": "ort_quantize static calibration ranges",
        "format": CACHE_FORMAT,
        "model": model.digest,
        "preprocess": preprocess_state,
        "data": feed.digest,
        "samples": feed.samples,
        "batch_size": cfg.calibration_batch_size,
        "method": method,
        "calibrator": options,
        "op_types": op_types,
        "onnxruntime": onnxruntime.__version__,
    }
    lookup, key = ranges_for(
        ctx.cache_dir,
        key_doc,
        method,
        lambda: compute_ranges(to_quantize, feed, method, options, op_types, workdir, large, check_providers(ctx)),
    )
    clamped = clamp_activation_ranges(graph, lookup.ranges)
    ranges_file = workdir / "calibration.json"
    store_ranges(ranges_file, lookup.ranges)
    details = {
        "dataset": cfg.calibration,
        "cached": lookup.status == "hit",
        "cache": lookup.status,
        "key": key,
        "method": method,
        "options": options,
        "samples": feed.samples,
        "batch_size": cfg.calibration_batch_size,
        "tensors": len(lookup.ranges.data),
        "clamped_ranges": clamped,
        "ignored_inputs": feed.ignored_inputs,
        "casts": feed.casts,
        "seconds": lookup.seconds,
    }
    if lookup.status == "corrupt":
        notes.append(f"the cached calibration ranges {key[:12]} could not be read, so they were computed again")
    return ranges_file, details


def _quantize_static(
    cfg: OrtQuantizeConfig,
    to_quantize: Path,
    quantized_file: Path,
    ranges_file: Path,
    op_types: list[str],
    nodes_to_quantize: list[str],
    nodes_to_exclude: list[str],
    large: bool,
) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    if "calibration_cache_path" not in inspect.signature(quantize_static).parameters:
        import onnxruntime

        raise KilnError(
            f"static mode gives quantize_static precomputed ranges through calibration_cache_path, which onnxruntime "
            f"{onnxruntime.__version__} lacks; install onnxruntime 1.31 or later"
        )
    # Calibration keys would only reach a calibrator quantize_static does not run here (the ranges
    # come from ranges_file): keep them out of what it is given.
    options = {k: v for k, v in _extra_options(cfg).items() if not k.startswith("Calib")}
    quantize_static(
        str(to_quantize),
        str(quantized_file),
        calibration_data_reader=None,
        quant_format=QuantFormat[cfg.quant_format or "QDQ"],
        op_types_to_quantize=op_types,
        per_channel=cfg.per_channel,
        reduce_range=cfg.reduce_range,
        activation_type=QuantType[_QUANT_TYPES[cfg.activation_type or "quint8"]],
        weight_type=QuantType[_QUANT_TYPES[cfg.weight_type]],
        nodes_to_quantize=nodes_to_quantize,
        nodes_to_exclude=nodes_to_exclude,
        use_external_data_format=large,
        calibrate_method=CalibrationMethod[cfg.calibration_method or "MinMax"],
        extra_options=options,
        calibration_cache_path=str(ranges_file),
    )


def _check_op_types(cfg: OrtQuantizeConfig, supported: list[str] | None) -> None:
    """Raise when an op type of ``op_types_to_quantize`` is not one the mode's quantizer handles
    (``supported`` None: any op type, as static QDQ wraps any op in QuantizeLinear/DequantizeLinear)."""
    given = cfg.op_types_to_quantize or []
    unsupported = [op for op in given if supported is not None and op not in supported]
    if not unsupported:
        return
    if cfg.mode == "dynamic":
        what = "dynamic mode"
        hint = " Gemm nodes are rewritten to MatMul before quantizing: list MatMul to quantize them." if "Gemm" in unsupported else ""
    else:
        what = "static mode with quant_format QOperator"
        hint = " quant_format QDQ quantizes any op type."
    raise KilnError(
        f"config.op_types_to_quantize of pass ort_quantize: {what} cannot quantize {', '.join(unsupported)}; "
        f"allowed: {', '.join(supported or [])}; given: {', '.join(given)}.{hint}"
    )


def _note_absent_op_types(cfg: OrtQuantizeConfig, graph: onnx.ModelProto, notes: list[str]) -> None:
    """Say which listed op types the model does not have (a typo, or a model unlike the one meant),
    when it has some of the others; having none of them is an error raised later."""
    if not cfg.op_types_to_quantize:
        return
    present = set(op_counts(graph))
    if "Gemm" in present and cfg.mode == "dynamic":
        present.add("MatMul")
    absent = [op for op in cfg.op_types_to_quantize if op not in present]
    if absent and len(absent) < len(cfg.op_types_to_quantize):
        notes.append(f"op_types_to_quantize lists {', '.join(absent)}, which the input model does not have")


def _node_list(names: list[str], graph: onnx.ModelProto, option: str) -> list[str]:
    """Check that every name is a node of ``graph``; add the names onnxruntime gives Gemm nodes it
    rewrites to MatMul (``<name>_MatMul``), so naming a Gemm works."""
    import difflib

    known = node_names(graph)
    unknown = [n for n in names if n not in known]
    if unknown:
        hints = []
        for n in unknown:
            close = difflib.get_close_matches(n, sorted(known), n=1, cutoff=0.6)
            hints.append(f"{n!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise KilnError(
            f"config.{option} of pass ort_quantize: no node of the input model is named {', '.join(hints)}; the model has {len(known)} named nodes"
        )
    gemms = {node.name for node in iter_nodes(graph.graph) if node.op_type == "Gemm"}
    return [*names, *(f"{n}_MatMul" for n in names if n in gemms)]


def preprocess_for_quantization(
    source: Path, workdir: Path, enabled: bool, keep_names: bool, large: bool, messages: list[LibraryMessage], notes: list[str]
) -> tuple[Path, str]:
    """Run ``quant_pre_process`` into ``workdir``; return the model to quantize and what happened:
    ``optimized``, ``shape_inference_only``, ``skipped`` or ``failed`` (then the input is used)."""
    if not enabled:
        return source, "skipped"
    from onnxruntime.quantization.shape_inference import quant_pre_process

    target = workdir / "preprocessed.onnx"
    target.unlink(missing_ok=True)
    seen = len(messages)
    try:
        quant_pre_process(
            str(source),
            str(target),
            skip_optimization=keep_names,
            skip_symbolic_shape=True,
            save_as_external_data=large,
            all_tensors_to_one_file=True,
            external_data_location="preprocessed.onnx.data",
        )
    except Exception as error:  # noqa: BLE001 - any failure here is recoverable: quantize the model as given, and say so
        notes.append(f"preprocessing (quant_pre_process) failed, so the model was quantized without it: {type(error).__name__}: {error}")
        return source, "failed"
    if not target.exists():
        notes.append("preprocessing (quant_pre_process) wrote no model, so the model was quantized without it")
        return source, "failed"
    errors = [m.message for m in messages[seen:] if m.source.startswith(_PREPROCESS_LOGGER) and m.level in ("ERROR", "CRITICAL")]
    if errors:
        # quant_pre_process logs the optimizer's failure (and its traceback) and carries on
        reason = errors[-1].splitlines()[-1]
        notes.append(f"preprocessing's graph optimization failed in onnxruntime, so only shape inference ran before quantizing: {reason}")
        return target, "shape_inference_only"
    return target, "shape_inference_only" if keep_names else "optimized"


def _extra_options(cfg: OrtQuantizeConfig) -> dict[str, Any]:
    """The user's extra_options plus the typed options' onnxruntime keys, with DefaultTensorType
    defaulted to FLOAT (a fused model's com.microsoft outputs have no inferred type, and the
    quantizers stop on them otherwise)."""
    import onnx

    options = dict(cfg.extra_options)
    for typed, key in TYPED_EXTRA_OPTIONS.items():
        value = getattr(cfg, typed)
        if value is not None:
            options[key] = value
    tensor_type = options.get("DefaultTensorType", onnx.TensorProto.FLOAT)
    if isinstance(tensor_type, str):
        try:
            tensor_type = onnx.TensorProto.DataType.Value(tensor_type.upper())
        except ValueError:
            raise KilnError(
                f"config.extra_options.DefaultTensorType of pass ort_quantize: unknown tensor type {tensor_type!r}; allowed: FLOAT, FLOAT16, ... or their numbers"
            ) from None
    options["DefaultTensorType"] = tensor_type
    return options


def _explain_nothing_quantized(cfg: OrtQuantizeConfig, model: onnx.ModelProto, op_types: list[str], unquantized: dict[str, int]) -> str:
    """The note for a run that quantized nothing, or an error when the user listed op types the
    model does not have at all (the config cannot apply to this model: say so loudly)."""
    present = set(op_counts(model))
    if "Gemm" in present and cfg.mode == "dynamic":
        present.add("MatMul")  # quantize_dynamic rewrites Gemm to MatMul before quantizing
    if cfg.op_types_to_quantize is not None and not present & set(cfg.op_types_to_quantize):
        raise KilnError(
            f"config.op_types_to_quantize of pass ort_quantize: the model has no {', '.join(cfg.op_types_to_quantize)} node, so nothing "
            f"would be quantized; its op types: {', '.join(sorted(present))}"
        )
    left = ", ".join(f"{n} {op}" for op, n in unquantized.items()) or "none"
    why = (
        "MatMul is quantized only when its B input is a constant weight (extra_options.MatMulConstBOnly)"
        if cfg.mode == "dynamic"
        else "check nodes_to_quantize / nodes_to_exclude and whether the calibration reached those nodes' tensors"
    )
    return (
        f"nothing was quantized: no node matched (op types {', '.join(op_types)}; nodes of those types not quantized: {left}). "
        f"{why}; the output is the input model after preprocessing"
    )
