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

``Config`` is a union on ``mode`` (``passes.quantize.ort_quantize_config``): a config validates as
``DynamicQuantizeConfig`` or ``StaticQuantizeConfig``. Options that apply to one mode only default
to None and are rejected, with the option's name, when given with the other mode. Static mode
fills its defaults in (quant_format QDQ, calibration_method MinMax, calibration_batch_size 1,
activation_type quint8), so the job key shows the values used.

onnx and onnxruntime are imported inside functions, never at module level: the engine imports
this module when it validates a workflow, only to read ``Config``, and that must stay fast.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from engine.core import Categorical, KilnError, ModelArtifact, PassContext, PassResult
from passes.common.library_logs import LibraryMessage, capture_library_logs, distinct
from passes.common.onnx_io import EXTERNAL_DATA_THRESHOLD, OnnxPass, save_onnx
from passes.common.pass_io import check_providers, onnx_output, open_onnx_input, require
from passes.quantize._parts import quantize_parts
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
from passes.quantize.ort_quantize_config import (
    MIN_BINS,
    STATIC_DEFAULTS,
    STATIC_ONLY,
    STATIC_UNSUPPORTED_EXTRA,
    TYPED_EXTRA_OPTIONS,
    OrtQuantizeConfig,
)
from passes.quantize.ort_quantizers import (
    explain_nothing_quantized,
    note_absent_op_types,
    preprocess_for_quantization,
    run_quantize_dynamic,
    run_quantize_static,
)

__all__ = [
    "MIN_BINS",
    "STATIC_DEFAULTS",
    "STATIC_ONLY",
    "STATIC_UNSUPPORTED_EXTRA",
    "TYPED_EXTRA_OPTIONS",
    "OrtQuantize",
    "OrtQuantizeConfig",
    "preprocess_for_quantization",
]

if TYPE_CHECKING:
    import onnx

    from passes.quantize.calibration import CalibrationFeed

#: the quantizers' advice when the input was not preprocessed: noise when the user chose so
_PREPROCESS_ADVICE = "Please consider"


class OrtQuantize(OnnxPass):
    name = "ort_quantize"
    summary = (
        "INT8 quantization with onnxruntime.quantization (dynamic: activations at run time; static: activations calibrated on a dataset)"
    )
    version = "2"
    #: leave in float the nodes around tensors 8-bit levels cannot resolve (calibration.unquantizable_nodes)
    float_unresolvable: ClassVar[bool] = True
    accepts = ("onnx", "seq2seq")
    produces = "onnx"
    keeps = ("seq2seq",)  # an encoder and a decoder with past: each quantized (passes.quantize._parts)
    libraries = ("onnx", "onnxruntime")

    @classmethod
    def warm_modules(cls, input_format: str) -> tuple[str, ...]:
        return (*cls.libraries, "onnxruntime.quantization")  # loaded lazily by the library, with its own imports (sympy...)

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

        if model.format == "seq2seq":
            return quantize_parts(self, model, ctx)
        (registry,) = require("onnxruntime", self.name, "onnxruntime.quantization.registry")
        cfg = self.config
        static = cfg.mode == "static"
        notes: list[str] = []
        if static:
            supported = sorted(registry.QLinearOpsRegistry) if cfg.quant_format == "QOperator" else None
            default_op_types = sorted(set(registry.QLinearOpsRegistry) | set(registry.QDQRegistry))
        else:
            supported = default_op_types = sorted(registry.IntegerOpsRegistry)
        _check_op_types(cfg, supported)
        given = open_onnx_input(model, ctx)
        source, graph = given.source, given.graph
        op_types = (
            sorted(set(cfg.op_types_to_quantize))
            if static and cfg.op_types_to_quantize
            else list(cfg.op_types_to_quantize or default_op_types)
        )
        nodes_to_quantize = _node_list(cfg.nodes_to_quantize or [], graph, "nodes_to_quantize")
        nodes_to_exclude = _node_list(cfg.nodes_to_exclude, graph, "nodes_to_exclude")
        note_absent_op_types(cfg, graph, notes)
        feed = self._calibration_feed(model, ctx, graph) if static else None
        quantized_file = given.workdir / "quantized.onnx"
        with capture_library_logs() as messages:
            before, preprocess_state, calibration, timings = self._quantize(
                model, ctx, source, quantized_file, feed, op_types, (nodes_to_quantize, nodes_to_exclude), messages, notes
            )

        output = onnx.load(str(quantized_file))
        dropped_domains = prune_unused_opsets(output)
        counts_in, counts_out = op_counts(before), op_counts(output)
        quantized_ops = new_quantized_ops(counts_in, counts_out)
        unquantized = unquantized_nodes(output, op_types, qdq=static and cfg.quant_format == "QDQ")
        if not quantized_ops:
            notes.append(explain_nothing_quantized(cfg, before, op_types, unquantized))

        out_file = save_onnx(output, ctx.output_dir)
        warnings = distinct([m for m in messages if not m.message.startswith(_PREPROCESS_ADVICE)])
        details = {
            **self._details(model, op_types, preprocess_state, graph, output, out_file),
            "quantized_ops": quantized_ops,
            "unquantized_nodes": unquantized,
            **_sizes(model, graph, output, out_file),
            "dropped_opset_domains": dropped_domains,
            "library_warnings": warnings,
            "seconds": timings,
        }
        if static:
            details["quant_format"] = cfg.quant_format
            details["calibration"] = calibration
        ctx.logger.debug("ort_quantize %s: quantized %s, not quantized %s", ctx.step_id, quantized_ops, unquantized)
        return onnx_output(model, ctx, details, notes)

    def _calibration_feed(self, model: ModelArtifact, ctx: PassContext, graph: onnx.ModelProto) -> CalibrationFeed:
        """The calibration batches: the workflow dataset's values of the model's inputs."""
        from passes.quantize.calibration import model_inputs, prepare_feed

        cfg = self.config
        assert cfg.calibration is not None and cfg.calibration_batch_size is not None  # the config validator sees to it
        return prepare_feed(
            ctx.dataset(cfg.calibration), cfg.calibration, model_inputs(graph), cfg.calibration_samples, cfg.calibration_batch_size
        )

    def _quantize(
        self,
        model: ModelArtifact,
        ctx: PassContext,
        source: Path,
        quantized_file: Path,
        feed: CalibrationFeed | None,
        op_types: list[str],
        nodes: tuple[list[str], list[str]],
        messages: list[LibraryMessage],
        notes: list[str],
    ) -> tuple[onnx.ModelProto, str, dict[str, Any], dict[str, float]]:
        """Preprocess, calibrate (static mode) and quantize ``source`` into ``quantized_file``; return
        the model as quantized (after preprocessing), what preprocessing did, the calibration
        details and the timings."""
        import onnx

        cfg = self.config
        workdir = Path(ctx.workdir)
        large = file_bytes(source) > EXTERNAL_DATA_THRESHOLD
        timings: dict[str, float] = {}
        calibration: dict[str, Any] = {}
        started = time.perf_counter()
        keep_names = bool(cfg.nodes_to_quantize or cfg.nodes_to_exclude)
        to_quantize, preprocess_state = preprocess_for_quantization(source, workdir, cfg.preprocess, keep_names, large, messages, notes)
        timings["preprocess"] = round(time.perf_counter() - started, 3)
        before = onnx.load(str(to_quantize), load_external_data=False)
        if feed is not None:
            started = time.perf_counter()
            ranges_file, calibration = _calibrate(cfg, model, ctx, to_quantize, before, preprocess_state, feed, op_types, large, notes)
            timings["calibrate"] = round(time.perf_counter() - started, 3)
            started = time.perf_counter()
            from passes.quantize.calibration import unquantizable_notes

            found, excluded = calibration.pop("unquantizable"), nodes[1]
            if self.float_unresolvable:  # ort_quantize_accuracy finds what to keep in float itself
                calibration["unquantizable"], excluded = found, sorted({*excluded, *found["nodes"]})
                notes += unquantizable_notes(found)
            run_quantize_static(cfg, to_quantize, quantized_file, ranges_file, op_types, nodes[0], excluded, large)
        else:
            started = time.perf_counter()
            run_quantize_dynamic(cfg, to_quantize, quantized_file, op_types, *nodes, large)
        timings["quantize"] = round(time.perf_counter() - started, 3)
        return before, preprocess_state, calibration, timings

    def _details(
        self,
        model: ModelArtifact,
        op_types: list[str],
        preprocess_state: str,
        graph: onnx.ModelProto,
        output: onnx.ModelProto,
        out_file: Path,
    ) -> dict[str, Any]:
        cfg = self.config
        static = cfg.mode == "static"
        return {
            "mode": cfg.mode,
            "weight_type": cfg.weight_type,
            "activation_type": cfg.activation_type if static else "quint8",
            "per_channel": cfg.per_channel,
            "reduce_range": cfg.reduce_range,
            "op_types_to_quantize": op_types,
            "preprocess": preprocess_state,
            "nodes_before": len(graph.graph.node),
            "nodes_after": len(output.graph.node),
        }


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
    from passes.quantize.calibration import clamp_activation_ranges, compute_ranges, ranges_for, store_ranges, unquantizable_nodes

    method = cfg.calibration_method
    assert method is not None
    options = _calibrator_options(cfg, method, notes)
    workdir = Path(ctx.workdir)
    key_doc = _ranges_key_doc(cfg, model, preprocess_state, feed, method, options, op_types)
    # Static calibration runs on the CPU for every target (check_providers: this pass is given no
    # target). The ranges are statistics of the float model's activations, and the CPU computes
    # them in exact float32 (a GPU may use TF32 or reorder reductions); the quantized model is then
    # one artifact, keyed without a target and shared by all of them, as are the cached ranges. A
    # TensorRT target that wants its own INT8 calibration gets it from TensorRT, not from this pass.
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
        "unquantizable": unquantizable_nodes(graph, lookup.ranges),  # an attention mask's fill value, the residual stream
        "ignored_inputs": feed.ignored_inputs,
        "casts": feed.casts,
        "seconds": lookup.seconds,
    }
    if lookup.status == "corrupt":
        notes.append(f"the cached calibration ranges {key[:12]} could not be read, so they were computed again")
    return ranges_file, details


def _calibrator_options(cfg: OrtQuantizeConfig, method: str, notes: list[str]) -> dict[str, Any]:
    from passes.quantize.calibration import calibrator_options

    typed = {
        "percentile": ("percentile", cfg.percentile),
        "num_bins": ("num_bins", cfg.num_bins),
        "moving_average": ("calib_moving_average", cfg.calib_moving_average),
    }
    options, unused = calibrator_options(method, typed, dict(cfg.extra_options))
    if unused:
        notes.append(f"{', '.join(unused)} {'is' if len(unused) == 1 else 'are'} not used by {method} calibration, so ignored")
    return options


def _ranges_key_doc(
    cfg: OrtQuantizeConfig,
    model: ModelArtifact,
    preprocess_state: str,
    feed: CalibrationFeed,
    method: str,
    options: dict[str, Any],
    op_types: list[str],
) -> dict[str, Any]:
    """What the cached calibration ranges are keyed by."""
    import onnxruntime

    from passes.quantize.calibration import CACHE_FORMAT

    return {
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


def _sizes(model: ModelArtifact, graph: onnx.ModelProto, output: onnx.ModelProto, out_file: Path) -> dict[str, Any]:
    return {
        "size_bytes_before": file_bytes(model.model_file),
        "size_bytes_after": file_bytes(out_file),
        "initializer_bytes_before": initializer_bytes(graph),
        "initializer_bytes_after": initializer_bytes(output),
    }


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
