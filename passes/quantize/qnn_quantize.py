"""Static QDQ quantization for NPUs under the rules onnxruntime ships for its QNN execution provider
(Qualcomm's HTP): what Olive's ``OnnxStaticQuantization`` does when its accelerator is the QNN EP.

It is ``ort_quantize`` in mode static, QDQ format, with two differences:

- the quantization config comes from ``onnxruntime.quantization.execution_providers.qnn.
  get_qnn_qdq_config``: every op type of the model is quantized (but Cast, and the ones named in
  ``op_types_to_exclude``), with tensor-level overrides that make the QDQ model valid on QNN (a
  16-bit Sigmoid's or Tanh's output gets the fixed scale and zero point QNN requires, a MatMul's
  weight stays per-tensor when per_channel is on since QNN has no per-channel MatMul, the weight
  of a MatMul or LayerNormalization fed a 16-bit activation takes the weight type, and
  ``init_overrides`` with ``add_qtype_converts`` get the type conversions mixed precision needs);
- the defaults are those of Olive's QNN recipes: 16-bit activations (quint16) and 8-bit weights
  (quint8), "A16W8"; optionally ``qnn_preprocess_model`` runs first (Erf sequences fused to
  Gelu, ReduceL2 ones to LpNormalization, ReduceMean ones to LayerNormalization if asked).

Calibration is ort_quantize's: on the CPU, cached by model, data and op types, and handed to
``quantize_static`` as its calibration cache. A separate pass rather than an ``ort_quantize``
option: the QNN rules choose the op types and per-tensor overrides themselves, allow QDQ only and
default to other types, and the options they take (init_overrides, add_qtype_converts, ...) mean
nothing to ort_quantize's CPU-oriented quantization; ort_quantize's configs and keys stay as they were.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, JsonValue, model_validator

from engine.core import Categorical, KilnError, ModelArtifact, PassContext
from passes.common.library_logs import LibraryMessage
from passes.common.onnx_io import EXTERNAL_DATA_THRESHOLD
from passes.quantize.onnx_facts import file_bytes
from passes.quantize.ort_quantize import OrtQuantize, _calibrate
from passes.quantize.ort_quantize_config import (
    ActivationType,
    StaticQuantizeConfig,
    WeightType,
    with_static_defaults,
)
from passes.quantize.ort_quantizers import QUANT_TYPES, extra_options_for, preprocess_for_quantization

if TYPE_CHECKING:
    import onnx

    from passes.quantize.calibration import CalibrationFeed

#: what this pass uses when these are not given (filled into the config, so into the key)
QNN_DEFAULTS: dict[str, Any] = {
    "mode": "static",
    "quant_format": "QDQ",
    "calibration_method": "MinMax",
    "calibration_batch_size": 1,
    "activation_type": "quint16",
}


class QnnQuantizeConfig(StaticQuantizeConfig):
    """Options of qnn_quantize: ort_quantize's static options, with QNN's defaults and rules."""

    mode: Literal["static"] = Field("static", description="Always static: activations are quantized with calibrated ranges.")
    quant_format: Literal["QDQ"] = Field("QDQ", description="Always QDQ: what QNN compiles.")
    activation_type: ActivationType = Field(
        "quint16", description="Data type of the activations (Olive's activation_type; QNN recipes: uint16)."
    )
    weight_type: WeightType = Field("quint8", description="Data type of the weights (Olive's precision; QNN recipes: uint8).")
    op_types_to_exclude: list[str] = Field(
        default_factory=list,
        description="Op types left in float (Olive's op_types_to_exclude), taken out of the op types the QNN rules quantize (every op type of the model but Cast).",
    )
    init_overrides: dict[str, list[dict[str, JsonValue]]] = Field(
        default_factory=dict,
        description=(
            "Tensor-level overrides given to get_qnn_qdq_config (its init_overrides; onnxruntime's TensorQuantOverrides): tensor "
            "name -> list of dicts with quant_type (quint8, qint16...), axis, symmetric, reduce_range, rmin, rmax, scale with "
            "zero_point, convert ({quant_type, recv_nodes}). Mixed precision: e.g. one tensor at quint16 in an 8-bit model."
        ),
    )
    add_qtype_converts: bool = Field(
        True, description="Let get_qnn_qdq_config add the type conversions init_overrides need so every op sees valid input types."
    )
    keep_removable_activations: bool = Field(
        False,
        description="Keep Relu / Clip after a quantized op instead of folding them into its output's quantization (onnxruntime's QDQKeepRemovableActivations).",
    )
    qnn_preprocess: bool = Field(
        False,
        description="Run qnn_preprocess_model before quantizing: Erf sequences fused to Gelu, ReduceL2 ones to LpNormalization.",
    )
    fuse_layernorm: bool = Field(False, description="With qnn_preprocess: also fuse ReduceMean sequences into LayerNormalization.")

    @model_validator(mode="before")
    @classmethod
    def _fill_static_defaults(cls, data: Any) -> Any:
        return with_static_defaults(data, QNN_DEFAULTS, mode="static")

    @model_validator(mode="after")
    def _check_qnn(self) -> QnnQuantizeConfig:
        if self.fuse_layernorm and not self.qnn_preprocess:
            raise ValueError("fuse_layernorm applies to qnn_preprocess; set qnn_preprocess: true or remove it")
        if self.op_types_to_quantize and self.op_types_to_exclude:
            raise ValueError("give op_types_to_quantize or op_types_to_exclude, not both")
        for name, entries in self.init_overrides.items():
            for entry in entries:
                for quant_type in (entry.get("quant_type"), (entry.get("convert") or {}).get("quant_type")):  # type: ignore[union-attr]
                    if quant_type is not None and quant_type not in QUANT_TYPES:
                        raise ValueError(f"init_overrides.{name}: unknown quant_type {quant_type!r}; allowed: {', '.join(QUANT_TYPES)}")
        return self


class QnnQuantize(OrtQuantize):
    name = "qnn_quantize"
    summary = (
        "static QDQ quantization under onnxruntime's QNN rules (16-bit activations, 8-bit weights by default), calibrated on a dataset"
    )
    version = "1"
    accepts = ("onnx", "genai")
    keeps = ("genai",)  # a decoder folder stays one: its model.onnx quantized, genai_config.json and the tokenizer copied

    search_space = {
        "per_channel": Categorical((False, True)),
        "activation_type": Categorical(("quint16", "quint8")),
        "weight_type": Categorical(("quint8", "qint8")),
        "calibration_method": Categorical(("MinMax", "Entropy", "Percentile")),
    }

    Config = QnnQuantizeConfig  # type: ignore[assignment]
    config: QnnQuantizeConfig

    def _calibration_feed(self, model: ModelArtifact, ctx: PassContext, graph: onnx.ModelProto) -> CalibrationFeed:
        """A decoder (``genai``) is calibrated on prefills of the dataset's token ids, its cache
        inputs empty (``passes.quantize.decoder_calibration``); an ONNX model as ort_quantize is."""
        if model.format != "genai":
            return super()._calibration_feed(model, ctx, graph)
        from passes.quantize.decoder_calibration import decoder_feed

        cfg = self.config
        assert cfg.calibration is not None
        return decoder_feed(ctx.dataset(cfg.calibration), cfg.calibration, graph, Path(model.path), cfg.calibration_samples)

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
        """ort_quantize's static steps with the QNN config between preprocessing and calibration.
        ``op_types`` is replaced, in place, by the op types that config quantizes, so the
        calibration, the details and the unquantized-node count all name those."""
        import onnx

        cfg = self.config
        assert feed is not None
        workdir = Path(ctx.workdir)
        large = file_bytes(source) > EXTERNAL_DATA_THRESHOLD
        timings: dict[str, float] = {}
        started = time.perf_counter()
        keep_names = bool(cfg.nodes_to_quantize or cfg.nodes_to_exclude)
        to_quantize, preprocess_state = preprocess_for_quantization(source, workdir, cfg.preprocess, keep_names, large, messages, notes)
        if cfg.qnn_preprocess:
            to_quantize, preprocess_state = _qnn_preprocess(to_quantize, workdir, cfg.fuse_layernorm, large, preprocess_state)
        timings["preprocess"] = round(time.perf_counter() - started, 3)
        before = onnx.load(str(to_quantize), load_external_data=False)
        qnn_config = _qnn_config(cfg, to_quantize, nodes[1], before)
        op_types[:] = sorted(qnn_config.op_types_to_quantize)
        started = time.perf_counter()
        ranges_file, calibration = _calibrate(cfg, model, ctx, to_quantize, before, preprocess_state, feed, op_types, large, notes)
        if model.format == "genai":
            from passes.quantize.decoder_calibration import tie_cache_ranges

            calibration["cache_ranges_from_present"] = len(tie_cache_ranges(ranges_file, Path(model.path)))
            if "GroupQueryAttention" in op_types:
                notes.append(
                    "the decoder's cache is quantized (QDQ around GroupQueryAttention): onnxruntime's CPU provider runs it with a "
                    "preallocated past/present buffer, but fails on a prefill fed an empty past; "
                    "op_types_to_exclude: [GroupQueryAttention] keeps the cache in float"
                )
        timings["calibrate"] = round(time.perf_counter() - started, 3)
        started = time.perf_counter()
        _run_quantize(cfg, qnn_config, to_quantize, quantized_file, ranges_file, op_types, nodes, large)
        timings["quantize"] = round(time.perf_counter() - started, 3)
        calibration["qnn_overrides"] = sorted(qnn_config.extra_options.get("TensorQuantOverrides", {}))
        return before, preprocess_state, calibration, timings


def _qnn_preprocess(to_quantize: Path, workdir: Path, fuse_layernorm: bool, large: bool, state: str) -> tuple[Path, str]:
    """qnn_preprocess_model into the workdir; it writes a model only when it changed one. onnxruntime
    1.31 fails on a model with metadata_props (it updates a dict with the repeated field), so they
    are taken off before and put back after."""
    import onnx
    from onnxruntime.quantization.execution_providers.qnn import qnn_preprocess_model

    model = onnx.load(str(to_quantize), load_external_data=False)
    metadata = {entry.key: entry.value for entry in model.metadata_props}
    del model.metadata_props[:]
    stripped = to_quantize.parent / "qnn_input.onnx"  # the job's own folder, beside any external data it references
    onnx.save(model, str(stripped))
    target = workdir / "qnn_preprocessed.onnx"
    changed = qnn_preprocess_model(
        str(stripped),
        str(target),
        fuse_layernorm=fuse_layernorm,
        save_as_external_data=large,
        all_tensors_to_one_file=True,
        external_data_location="qnn_preprocessed.onnx.data",
    )
    if not changed:
        return to_quantize, f"{state}+qnn_unchanged"
    output = onnx.load(str(target), load_external_data=False)
    onnx.helper.set_model_props(output, {**{e.key: e.value for e in output.metadata_props}, **metadata})
    onnx.save(output, str(target))
    return target, f"{state}+qnn"


def _quant_type(name: Any) -> Any:
    from onnxruntime.quantization import QuantType

    return QuantType[QUANT_TYPES[str(name)]]


def _overrides(given: dict[str, list[dict[str, JsonValue]]]) -> dict[str, list[dict[str, Any]]]:
    """init_overrides in onnxruntime's form: QuantType members, numpy scales and zero points, sets of receiving nodes."""
    import numpy as np

    out: dict[str, list[dict[str, Any]]] = {}
    for tensor, entries in given.items():
        out[tensor] = []
        for entry in entries:
            item: dict[str, Any] = dict(entry)
            if "quant_type" in item:
                item["quant_type"] = _quant_type(item["quant_type"])
            if "scale" in item:
                item["scale"] = np.array(item["scale"], dtype=np.float32)
            if "zero_point" in item:
                kind = {"qint8": np.int8, "quint8": np.uint8, "qint16": np.int16, "quint16": np.uint16}[
                    str(entry.get("quant_type", "quint8"))
                ]
                item["zero_point"] = np.array(item["zero_point"], dtype=kind)
            if isinstance(item.get("convert"), dict):
                convert = dict(item["convert"])
                if "quant_type" in convert:
                    convert["quant_type"] = _quant_type(convert["quant_type"])
                if "recv_nodes" in convert:
                    convert["recv_nodes"] = set(convert["recv_nodes"])
                item["convert"] = convert
            out[tensor].append(item)
    return out


def _qnn_config(cfg: QnnQuantizeConfig, to_quantize: Path, nodes_to_exclude: list[str], model: onnx.ModelProto) -> Any:
    """get_qnn_qdq_config for the preprocessed model (no data reader: the ranges are calibrated apart)."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    op_types = cfg.op_types_to_quantize
    if cfg.op_types_to_exclude:
        present = {node.op_type for node in model.graph.node}
        op_types = sorted(present - set(cfg.op_types_to_exclude) - {"Cast"})
        if not op_types:
            raise KilnError(
                f"config.op_types_to_exclude of pass qnn_quantize excludes every op type of the model ({', '.join(sorted(present))})"
            )
    return get_qnn_qdq_config(
        str(to_quantize),
        None,  # type: ignore[arg-type]
        calibrate_method=CalibrationMethod[cfg.calibration_method],
        activation_type=_quant_type(cfg.activation_type),
        weight_type=_quant_type(cfg.weight_type),
        per_channel=cfg.per_channel,
        init_overrides=_overrides(cfg.init_overrides) or None,
        add_qtype_converts=cfg.add_qtype_converts,
        activation_symmetric=bool(cfg.symmetric_activation),
        weight_symmetric=cfg.symmetric_weight,
        keep_removable_activations=cfg.keep_removable_activations,
        op_types_to_quantize=op_types,
        nodes_to_exclude=nodes_to_exclude or None,
    )


def _run_quantize(
    cfg: QnnQuantizeConfig,
    qnn_config: Any,
    to_quantize: Path,
    quantized_file: Path,
    ranges_file: Path,
    op_types: list[str],
    nodes: tuple[list[str], list[str]],
    large: bool,
) -> None:
    """quantize_static with the QNN config's options, the user's extra_options over them (as Olive
    does), and the calibrated ranges as its calibration cache."""
    from onnxruntime.quantization import QuantFormat, quantize_static

    user = {k: v for k, v in extra_options_for(cfg).items() if not k.startswith("Calib")}
    options = {**{k: v for k, v in qnn_config.extra_options.items() if not k.startswith("Calib")}, **user}
    quantize_static(
        str(to_quantize),
        str(quantized_file),
        calibration_data_reader=None,
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=op_types,
        per_channel=cfg.per_channel,
        reduce_range=cfg.reduce_range,
        activation_type=qnn_config.activation_type,
        weight_type=qnn_config.weight_type,
        nodes_to_quantize=nodes[0],
        nodes_to_exclude=nodes[1],
        use_external_data_format=large or qnn_config.use_external_data_format,
        calibrate_method=qnn_config.calibrate_method,
        extra_options=options,
        calibration_cache_path=str(ranges_file),
    )
