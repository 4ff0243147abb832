"""INT8 quantization of an ONNX model with onnxruntime's own quantizer (``onnxruntime.quantization``).

Dynamic mode (the only one so far): weights are quantized ahead of time, activations at run time
(``DynamicQuantizeLinear`` → ``MatMulInteger`` / ``ConvInteger`` → rescale). It needs no
calibration data. Steps, all inside the step's workdir:

1. optionally ``quant_pre_process`` (onnxruntime's optimizer at BASIC level + ONNX shape
   inference; symbolic shape inference is skipped, it fails on transformer exports);
2. ``quantize_dynamic``;
3. drop the opset imports the optimizer added but no node uses, and save with ``save_onnx``.

onnx and onnxruntime are imported inside functions, never at module level: the engine imports
this module when it validates a workflow, only to read ``Config``, and that must stay fast.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, JsonValue, model_validator

from engine.core import Categorical, KilnError, MissingDependency, ModelArtifact, PassConfig, PassContext, PassResult
from passes.common.onnx_io import EXTERNAL_DATA_THRESHOLD, OnnxPass, clamp_ir_version, default_opset, ort_limits, save_onnx
from passes.quantize.library_logs import LibraryMessage, capture_library_logs, distinct
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

#: the logger ``quant_pre_process`` reports its swallowed optimizer failure on
_PREPROCESS_LOGGER = "onnxruntime.quantization.shape_inference"
#: quantize_dynamic's advice when the input was not preprocessed: noise when the user chose so
_PREPROCESS_ADVICE = "Please consider to run pre-processing before quantization"


class QuantizeOptions(PassConfig):
    """Options every quantization mode shares. ``mode: static`` will add its calibration options
    as a second variant of this class, discriminated by ``mode``."""

    weight_type: Literal["qint8", "quint8"] = Field(
        "qint8",
        description="Data type of the quantized weights: signed (qint8) or unsigned (quint8) 8-bit. Dynamic mode always quantizes activations to quint8.",
    )
    per_channel: bool = Field(
        False,
        description="One scale and zero point per output channel of each weight instead of one per tensor. Usually more accurate (all-MiniLM-L6-v2: cosine 0.993 vs 0.960).",
    )
    reduce_range: bool = Field(
        False,
        description="Quantize weights to 7 bits. Can help accuracy on CPUs without VNNI (saturation in the u8s8 dot product); rarely useful with VNNI.",
    )
    op_types_to_quantize: list[str] | None = Field(
        None,
        description=(
            "Op types to quantize. null = every op type onnxruntime's dynamic quantizer supports "
            "(onnxruntime 1.31: Conv, MatMul, Attention, LSTM, Gather, Transpose, EmbedLayerNormalization; "
            "Gemm nodes are rewritten to MatMul first, so list MatMul for them). "
            "If the model has none of the listed op types the pass fails."
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
    extra_options: dict[str, JsonValue] = Field(
        default_factory=dict,
        description=(
            "Passed to onnxruntime as extra_options (see quantize_dynamic's documentation), e.g. MatMulConstBOnly "
            "(default true in dynamic mode: only MatMuls with a constant B are quantized), WeightSymmetric, EnableSubgraph. "
            "DefaultTensorType defaults to 1 (FLOAT) so fused models with com.microsoft ops quantize; "
            "a TensorProto type name such as 'FLOAT' is accepted too. Unknown keys are ignored by onnxruntime."
        ),
    )

    @model_validator(mode="after")
    def _check_lists(self) -> QuantizeOptions:
        if self.op_types_to_quantize is not None and not self.op_types_to_quantize:
            raise ValueError("op_types_to_quantize is an empty list; use null for the default op types")
        if self.nodes_to_quantize is not None and not self.nodes_to_quantize:
            raise ValueError("nodes_to_quantize is an empty list; use null to quantize every node of the quantized op types")
        if self.nodes_to_quantize:
            both = sorted(set(self.nodes_to_quantize) & set(self.nodes_to_exclude))
            if both:
                raise ValueError(f"nodes both in nodes_to_quantize and nodes_to_exclude: {', '.join(both)}")
        return self


class OrtQuantize(OnnxPass):
    name = "ort_quantize"
    summary = "INT8 quantization with onnxruntime.quantization (dynamic: weights ahead of time, activations at run time)"
    version = "1"
    accepts = ("onnx",)
    produces = "onnx"
    libraries = ("onnx", "onnxruntime")
    search_space = {"per_channel": Categorical((False, True)), "reduce_range": Categorical((False, True))}

    class Config(QuantizeOptions):
        mode: Literal["dynamic"] = Field(
            "dynamic", description="Quantization mode. dynamic: activations are quantized at run time; no calibration data needed."
        )

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        import onnx

        try:
            from onnxruntime.quantization import QuantType, quantize_dynamic
            from onnxruntime.quantization.registry import IntegerOpsRegistry
        except ImportError as error:
            raise MissingDependency("onnxruntime", "the ort_quantize pass") from error

        cfg = self.config
        workdir = Path(ctx.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        notes: list[str] = []

        _check_op_types(cfg.op_types_to_quantize, sorted(IntegerOpsRegistry))
        source = _runtime_loadable(model.model_file, workdir)
        graph = onnx.load(str(source), load_external_data=False)
        op_types = list(cfg.op_types_to_quantize or sorted(IntegerOpsRegistry))
        nodes_to_quantize = _node_list(cfg.nodes_to_quantize or [], graph, "nodes_to_quantize")
        nodes_to_exclude = _node_list(cfg.nodes_to_exclude, graph, "nodes_to_exclude")
        large = file_bytes(source) > EXTERNAL_DATA_THRESHOLD
        quantized_file = workdir / "quantized.onnx"
        timings: dict[str, float] = {}

        with capture_library_logs() as messages:
            started = time.perf_counter()
            keep_names = bool(cfg.nodes_to_quantize or cfg.nodes_to_exclude)
            to_quantize, preprocess_state = _preprocess(source, workdir, cfg.preprocess, keep_names, large, messages, notes)
            timings["preprocess"] = round(time.perf_counter() - started, 3)
            before = onnx.load(str(to_quantize), load_external_data=False)

            started = time.perf_counter()
            quantize_dynamic(
                str(to_quantize),
                str(quantized_file),
                op_types_to_quantize=op_types,
                per_channel=cfg.per_channel,
                reduce_range=cfg.reduce_range,
                weight_type=QuantType.QInt8 if cfg.weight_type == "qint8" else QuantType.QUInt8,
                nodes_to_quantize=nodes_to_quantize,
                nodes_to_exclude=nodes_to_exclude,
                use_external_data_format=large,
                extra_options=_extra_options(cfg.extra_options),
            )
            timings["quantize"] = round(time.perf_counter() - started, 3)

        output = onnx.load(str(quantized_file))
        dropped_domains = prune_unused_opsets(output)
        counts_in, counts_out = op_counts(before), op_counts(output)
        quantized_ops = new_quantized_ops(counts_in, counts_out)
        unquantized = unquantized_nodes(output, op_types)
        if not quantized_ops:
            notes.append(_explain_nothing_quantized(cfg, before, op_types, unquantized))

        out_file = save_onnx(output, ctx.output_dir)
        warnings = distinct([m for m in messages if not m.message.startswith(_PREPROCESS_ADVICE)])
        details: dict[str, Any] = {
            "mode": cfg.mode,
            "weight_type": cfg.weight_type,
            "activation_type": "quint8",
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
        ctx.logger.debug("ort_quantize %s: quantized %s, not quantized %s", ctx.step_id, quantized_ops, unquantized)
        return PassResult(model=ModelArtifact.from_folder("onnx", Path(ctx.output_dir), attrs=model.attrs), details=details, notes=notes)


def _runtime_loadable(model_file: Path, workdir: Path) -> Path:
    """``model_file``, or a copy in ``workdir`` with the IR version lowered to what onnxruntime
    loads (``quant_pre_process`` opens the model in an onnxruntime session)."""
    import onnx

    header = onnx.load(str(model_file), load_external_data=False)
    max_ir, max_opset = ort_limits()
    opset = default_opset(header)
    if opset > max_opset:
        raise KilnError(
            f"the input model uses opset {opset}; the installed onnxruntime runs at most opset {max_opset}. Fix: export with opset <= {max_opset}"
        )
    if header.ir_version <= max_ir:
        return model_file
    full = clamp_ir_version(onnx.load(str(model_file)))
    return save_onnx(full, workdir / "input")


def _check_op_types(given: list[str] | None, supported: list[str]) -> None:
    unsupported = [op for op in given or [] if op not in supported]
    if not unsupported:
        return
    hint = " Gemm nodes are rewritten to MatMul before quantizing: list MatMul to quantize them." if "Gemm" in unsupported else ""
    raise KilnError(
        f"config.op_types_to_quantize of pass ort_quantize: dynamic mode cannot quantize {', '.join(unsupported)}; "
        f"allowed: {', '.join(supported)}; given: {', '.join(given or [])}.{hint}"
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


def _preprocess(
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
    errors = [m.message for m in messages[seen:] if m.logger.startswith(_PREPROCESS_LOGGER) and m.level in ("ERROR", "CRITICAL")]
    if errors:
        # quant_pre_process logs the optimizer's failure (and its traceback) and carries on
        reason = errors[-1].splitlines()[-1]
        notes.append(f"preprocessing's graph optimization failed in onnxruntime, so only shape inference ran before quantizing: {reason}")
        return target, "shape_inference_only"
    return target, "shape_inference_only" if keep_names else "optimized"


def _extra_options(given: dict[str, Any]) -> dict[str, Any]:
    """The user's extra_options with DefaultTensorType defaulted to FLOAT (a fused model's
    com.microsoft outputs have no inferred type, and quantize_dynamic stops on them otherwise)."""
    import onnx

    options = dict(given)
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


def _explain_nothing_quantized(cfg: OrtQuantize.Config, model: onnx.ModelProto, op_types: list[str], unquantized: dict[str, int]) -> str:
    """The note for a run that quantized nothing, or an error when the user listed op types the
    model does not have at all (the config cannot apply to this model: say so loudly)."""
    present = set(op_counts(model))
    if "Gemm" in present:
        present.add("MatMul")  # quantize_dynamic rewrites Gemm to MatMul before quantizing
    if cfg.op_types_to_quantize is not None and not present & set(cfg.op_types_to_quantize):
        raise KilnError(
            f"config.op_types_to_quantize of pass ort_quantize: the model has no {', '.join(cfg.op_types_to_quantize)} node, so nothing "
            f"would be quantized; its op types: {', '.join(sorted(present))}"
        )
    left = ", ".join(f"{n} {op}" for op, n in unquantized.items()) or "none"
    return (
        f"nothing was quantized: no node matched (op types {', '.join(op_types)}; nodes of those types not quantized: {left}). "
        "MatMul is quantized only when its B input is a constant weight (extra_options.MatMulConstBOnly); "
        "the output is the input model after preprocessing"
    )
