"""onnxruntime's quantizer calls of ``ort_quantize``: preprocessing, ``quantize_dynamic`` and
``quantize_static`` given precomputed ranges, and the extra_options they are given. onnx and
onnxruntime are imported inside functions (the engine imports pass modules to validate)."""

from __future__ import annotations

import inspect
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core import KilnError
from passes.common.library_logs import LibraryMessage
from passes.quantize.onnx_facts import op_counts
from passes.quantize.ort_quantize_config import TYPED_EXTRA_OPTIONS, OrtQuantizeConfig

if TYPE_CHECKING:
    import onnx

#: the logger ``quant_pre_process`` reports its swallowed optimizer failure on
_PREPROCESS_LOGGER = "onnxruntime.quantization.shape_inference"


QUANT_TYPES = {"qint8": "QInt8", "quint8": "QUInt8", "qint16": "QInt16", "quint16": "QUInt16"}


def run_quantize_dynamic(
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
        weight_type=QuantType[QUANT_TYPES[cfg.weight_type]],
        nodes_to_quantize=nodes_to_quantize,
        nodes_to_exclude=nodes_to_exclude,
        use_external_data_format=large,
        extra_options=extra_options_for(cfg),
    )


def run_quantize_static(
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
    options = {k: v for k, v in extra_options_for(cfg).items() if not k.startswith("Calib")}
    quantize_static(
        str(to_quantize),
        str(quantized_file),
        calibration_data_reader=None,
        quant_format=QuantFormat[cfg.quant_format or "QDQ"],
        op_types_to_quantize=op_types,
        per_channel=cfg.per_channel,
        reduce_range=cfg.reduce_range,
        activation_type=QuantType[QUANT_TYPES[cfg.activation_type or "quint8"]],
        weight_type=QuantType[QUANT_TYPES[cfg.weight_type]],
        nodes_to_quantize=nodes_to_quantize,
        nodes_to_exclude=nodes_to_exclude,
        use_external_data_format=large,
        calibrate_method=CalibrationMethod[cfg.calibration_method or "MinMax"],
        extra_options=options,
        calibration_cache_path=str(ranges_file),
    )


def linked_input(source: Path, workdir: Path) -> Path:
    """``source`` as seen from a folder of the job's own: the model file and its external data
    files linked there. onnxruntime's quantizers write a shape-inferred copy next to the model
    they are given (``<name>-inferred.onnx``) and delete it: next to the input itself, jobs
    quantizing one model at once delete each other's copy, and a stored object or the user's
    folder would be written into."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    model = onnx.load(str(source), load_external_data=False)
    names = {source.name}
    for tensor in _get_all_tensors(model):
        if uses_external_data(tensor):
            names.update(entry.value for entry in tensor.external_data if entry.key == "location")
    folder = workdir / "input"
    folder.mkdir(parents=True, exist_ok=True)
    for name in sorted(names):
        link = folder / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            _link(source.parent / name, link, data=name != source.name)
    return folder / source.name


def _link(target: Path, link: Path, data: bool) -> None:
    """The model file as a symbolic link; an external-data file as a copy: onnx's checker (which
    onnxruntime's calibrator runs) refuses external data behind a symbolic or a hard link."""
    if data:
        shutil.copyfile(target, link)
    else:
        os.symlink(target.resolve(), link)


def preprocess_for_quantization(
    source: Path, workdir: Path, enabled: bool, keep_names: bool, large: bool, messages: list[LibraryMessage], notes: list[str]
) -> tuple[Path, str]:
    """Run ``quant_pre_process`` into ``workdir``; return the model to quantize and what happened:
    ``optimized``, ``shape_inference_only``, ``skipped`` or ``failed`` (then the input is used,
    through links in ``workdir``: see ``linked_input``)."""
    if not enabled:
        return linked_input(source, workdir), "skipped"
    target = workdir / "preprocessed.onnx"
    target.unlink(missing_ok=True)
    seen = len(messages)
    try:
        if large:
            messages += _preprocess_in_child(source, target, keep_names)
        else:
            _quant_pre_process(source, target, keep_names, large)
    except Exception as error:  # noqa: BLE001 - any failure here is recoverable: quantize the model as given, and say so
        notes.append(f"preprocessing (quant_pre_process) failed, so the model was quantized without it: {type(error).__name__}: {error}")
        return linked_input(source, workdir), "failed"
    if not target.exists():
        notes.append("preprocessing (quant_pre_process) wrote no model, so the model was quantized without it")
        return linked_input(source, workdir), "failed"
    errors = [m.message for m in messages[seen:] if m.source.startswith(_PREPROCESS_LOGGER) and m.level in ("ERROR", "CRITICAL")]
    if errors:
        # quant_pre_process logs the optimizer's failure (and its traceback) and carries on
        reason = errors[-1].splitlines()[-1]
        notes.append(f"preprocessing's graph optimization failed in onnxruntime, so only shape inference ran before quantizing: {reason}")
        return target, "shape_inference_only"
    return target, "shape_inference_only" if keep_names else "optimized"


def _quant_pre_process(source: Path, target: Path, keep_names: bool, large: bool) -> None:
    from onnxruntime.quantization.shape_inference import quant_pre_process

    quant_pre_process(
        str(source),
        str(target),
        skip_optimization=keep_names,
        skip_symbolic_shape=True,
        save_as_external_data=large,
        all_tensors_to_one_file=True,
        external_data_location="preprocessed.onnx.data",
    )


def _preprocess_in_child(source: Path, target: Path, keep_names: bool) -> list[LibraryMessage]:
    """``quant_pre_process`` of a model past 2 GB in a child process (passes.common.child), returning
    what it logged. The preprocessing holds about twice the model (the optimizer's copy and shape
    inference's); in the worker the quantizer's three times that followed before the first was
    given back. A child that dies raises: the preprocessing failed, and the model is quantized as
    given, as for any other failure of it."""
    from passes.common.child import run_in_child

    return run_in_child(_preprocess_logged, source, target, keep_names)


def _preprocess_logged(source: Path, target: Path, keep_names: bool) -> list[LibraryMessage]:
    """The child's side of ``_preprocess_in_child``: run it, collecting the library's log records."""
    from passes.common.library_logs import capture_library_logs

    with capture_library_logs() as messages:
        _quant_pre_process(source, target, keep_names, large=True)
    return list(messages)


def extra_options_for(cfg: OrtQuantizeConfig) -> dict[str, Any]:
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


def note_absent_op_types(cfg: OrtQuantizeConfig, graph: onnx.ModelProto, notes: list[str]) -> None:
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


def explain_nothing_quantized(cfg: OrtQuantizeConfig, model: onnx.ModelProto, op_types: list[str], unquantized: dict[str, int]) -> str:
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
