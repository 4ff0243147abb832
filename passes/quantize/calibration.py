"""Calibration for static INT8 quantization with onnxruntime: feed a workflow dataset to one of
onnxruntime's calibrators and cache the activation ranges it computes, keyed by content.

Static quantization fixes a scale and zero point for every activation it quantizes, from ranges
measured on calibration data. Measuring is the slow part (the model runs on every sample with
every calibrated tensor as an extra output), and it depends only on the model, the data, the op
types whose tensors are measured and the calibration options — not on per_channel, weight_type,
quant_format or which nodes are excluded. So the ranges are stored in the pass's cache folder
under the sha256 of exactly those inputs, and candidates that differ only downstream reuse them.

The cache entry is onnxruntime's own calibration cache format (``save_tensors_data`` /
``load_tensors_data``, JSON) plus a ``kiln`` entry holding the key document, so a reader can tell
what the ranges were measured on. An entry that does not parse, or whose key document differs,
is a miss and is overwritten (atomically: temporary file + ``os.replace``).

onnxruntime and onnx are imported inside functions: importing this module must stay cheap.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.core import KilnError, sha256_json

if TYPE_CHECKING:
    import onnx
    from onnxruntime.quantization.calibrate import TensorsData

    from engine.core.data import Dataset

#: bumped when what a cache entry holds, or how it is computed, changes
CACHE_FORMAT = 1

#: onnxruntime 1.31's ``create_calibrator`` defaults, per method, written out so that the cache key
#: names every value the calibrator used (and a changed library default cannot hide behind "None").
METHOD_DEFAULTS: dict[str, dict[str, Any]] = {
    "MinMax": {"symmetric": False, "moving_average": False, "averaging_constant": 0.01, "max_intermediate_outputs": None},
    "Entropy": {"symmetric": False, "num_bins": 128, "num_quantized_bins": 128},
    "Percentile": {"symmetric": True, "num_bins": 2048, "percentile": 99.999},
    "Distribution": {"num_bins": 2048, "scenario": "same"},
}

#: quantize_static's extra_options that configure the calibrator, and the calibrator's name for each
EXTRA_TO_CALIBRATOR: dict[str, str] = {
    "CalibTensorRangeSymmetric": "symmetric",
    "CalibMovingAverage": "moving_average",
    "CalibMovingAverageConstant": "averaging_constant",
    "CalibMaxIntermediateOutputs": "max_intermediate_outputs",
    "CalibPercentile": "percentile",
}

_KINDS = {"i": "integer", "u": "integer", "f": "float", "b": "bool"}


def calibrator_options(method: str, typed: dict[str, Any], extra: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The options ``create_calibrator`` gets for ``method``: its defaults, overridden by the
    calibration keys of ``extra`` (onnxruntime's names) and by ``typed`` (the pass's own options,
    calibrator names, None = not given). Returns them with the names of given options that
    ``method`` does not use (reported, not rejected: a search over methods carries them along)."""
    options = dict(METHOD_DEFAULTS[method])
    given: dict[str, tuple[str, Any]] = {}
    for extra_name, name in EXTRA_TO_CALIBRATOR.items():
        if extra_name in extra:
            given[name] = (f"extra_options.{extra_name}", extra[extra_name])
    for name, (label, value) in typed.items():
        if value is not None:
            given[name] = (label, value)
    unused = []
    for name, (label, value) in given.items():
        if name in options:
            options[name] = value
        else:
            unused.append(label)
    if not options.get("moving_average", True):
        options.pop("averaging_constant")  # only read with a moving average: keep it out of the key
    return options, sorted(unused)


# --------------------------------------------------------------------------- the calibration data


@dataclass
class CalibrationFeed:
    """The batches the calibrator runs, cast to the model's input types, and their digest."""

    batches: list[dict[str, np.ndarray]]
    samples: int
    digest: str
    ignored_inputs: list[str] = field(default_factory=list)
    casts: dict[str, str] = field(default_factory=dict)


class BatchReader:
    """An onnxruntime ``CalibrationDataReader`` over batches in memory (onnxruntime recognises any
    object with ``get_next``, so this class needs no onnxruntime import). Iterating it gives the
    batches ``get_next`` has not given yet, without using them up: the GPTQ code deep-copies the
    reader and iterates the copy, ``collect_activations`` iterates the reader itself."""

    def __init__(self, batches: list[dict[str, np.ndarray]]) -> None:
        self.batches = batches
        self.position = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.position >= len(self.batches):
            return None
        self.position += 1
        return self.batches[self.position - 1]

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return iter(self.batches[self.position :])

    def __len__(self) -> int:
        return len(self.batches)


def model_inputs(model: onnx.ModelProto) -> dict[str, np.dtype]:
    """The inputs a caller feeds (graph inputs that are not initializers), with numpy dtypes."""
    import onnx

    initializers = {t.name for t in model.graph.initializer}
    inputs: dict[str, np.dtype] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        inputs[value.name] = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
    return inputs


def prepare_feed(dataset: Dataset, name: str, inputs: dict[str, np.dtype], samples: int | None, batch_size: int) -> CalibrationFeed:
    """Batches of the first ``samples`` samples of ``dataset`` (all when None) holding only the
    model's ``inputs``, each cast to the model's dtype when only the width differs."""
    available = len(dataset)
    if available == 0:
        raise KilnError(f"calibration dataset '{name}' has no samples")
    if samples is not None and available < samples:
        raise KilnError(f"calibration set has {available} samples, fewer than the {samples} asked (config.calibration_samples)")
    count = available if samples is None else samples
    missing = [n for n in inputs if n not in dataset.inputs]
    if missing:
        raise KilnError(
            f"calibration dataset '{name}' has no input {', '.join(repr(n) for n in missing)}; "
            f"the model's inputs: {', '.join(inputs)}; the dataset's: {', '.join(dataset.inputs) or 'none'}"
        )
    arrays: dict[str, np.ndarray] = {}
    casts: dict[str, str] = {}
    for input_name, dtype in inputs.items():
        array = np.asarray(dataset.inputs[input_name])[:count]
        if array.dtype != dtype:
            have, want = _KINDS.get(array.dtype.kind), _KINDS.get(dtype.kind)
            if have is None or have != want:
                raise KilnError(
                    f"calibration dataset '{name}': input '{input_name}' holds {array.dtype} values; the model's input is {dtype}"
                )
            casts[input_name] = f"{array.dtype}->{dtype}"
            array = array.astype(dtype)
        arrays[input_name] = np.ascontiguousarray(array)
    digest = hashlib.sha256()
    for input_name in sorted(arrays):
        array = arrays[input_name]
        digest.update(json.dumps([input_name, array.dtype.str, list(array.shape)]).encode())
        digest.update(array.data)
    batches = [{n: a[start : start + batch_size] for n, a in arrays.items()} for start in range(0, count, batch_size)]
    ignored = sorted(n for n in dataset.inputs if n not in inputs)
    return CalibrationFeed(batches=batches, samples=count, digest=digest.hexdigest(), ignored_inputs=ignored, casts=casts)


# --------------------------------------------------------------------------- computing the ranges


def compute_ranges(
    model_file: Path,
    feed: CalibrationFeed,
    method: str,
    options: dict[str, Any],
    op_types: list[str],
    workdir: Path,
    large: bool,
    providers: list[str] | None = None,
) -> TensorsData:
    """Run onnxruntime's calibrator for ``method`` over the feed (with ``providers``, default CPU);
    return its ranges."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import TensorsData, create_calibrator

    augmented = workdir / "augmented_model.onnx"
    # The histogram calibrators print progress with print(): keep it off the process's stdout.
    with contextlib.redirect_stdout(io.StringIO()):
        calibrator = create_calibrator(
            model_file,
            op_types,
            augmented_model_path=str(augmented),
            calibrate_method=CalibrationMethod[method],
            use_external_data_format=large,
            providers=providers or ["CPUExecutionProvider"],
            extra_options=options,
        )
        calibrator.collect_data(BatchReader(feed.batches))
        ranges = calibrator.compute_data()
    del calibrator
    for path in workdir.glob("augmented_model.onnx*"):
        path.unlink()
    if not isinstance(ranges, TensorsData):
        raise KilnError(f"onnxruntime's {method} calibrator returned {type(ranges).__name__}, not TensorsData")
    return ranges


def clamp_activation_ranges(model: onnx.ModelProto, ranges: TensorsData) -> list[str]:
    """Raise the lower bound of every Relu output's range to 0 (Clip's: to its constant min).

    onnxruntime removes a Relu (or Clip) that follows a quantized op when activations are
    asymmetric, trusting the output's quantization to clip. Symmetric calibration ranges
    (Distribution, CalibTensorRangeSymmetric) put a Relu output's range at [-m, m], so the removed
    Relu then clips nothing and the model is wrong (a Linear-ReLU-Linear: 94 % error instead of
    2 %). A Relu output is never negative, so the clamp loses nothing. Returns the tensors changed.
    """
    from onnx import TensorProto, numpy_helper

    initializers = {t.name: t for t in model.graph.initializer}
    changed = []
    for node in model.graph.node:
        if not node.output or node.output[0] not in ranges:
            continue
        floor = None
        if node.op_type == "Relu":
            floor = 0.0
        elif node.op_type == "Clip":
            low = next((a.f for a in node.attribute if a.name == "min"), None)
            bound = initializers.get(node.input[1]) if low is None and len(node.input) > 1 else None
            if bound is not None and bound.data_location != TensorProto.EXTERNAL:
                low = float(numpy_helper.to_array(bound))
            floor = low
        if floor is None:
            continue
        data = ranges[node.output[0]]
        lowest = np.asarray(data.lowest)
        if np.any(lowest < floor):
            data.lowest = np.maximum(lowest, np.asarray(floor, dtype=lowest.dtype)).astype(lowest.dtype)
            if hasattr(data, "highest"):
                data.highest = np.maximum(np.asarray(data.highest), data.lowest).astype(lowest.dtype)
            changed.append(node.output[0])
    return sorted(changed)


#: a calibrated range reaching this magnitude marks a tensor 8-bit levels cannot resolve: an
#: attention mask's fill value (torch.finfo(float32).min in transformers' eager attention, -10000 in
#: older exports) and the scores it is added to. At 1e4 a level of int8 is 79 wide, so every
#: ordinary activation (|x| < 10) rounds to 0: quantizing the mask Add of an unfused MiniLM export
#: (scale 2.7e36) made attention uniform and its embeddings' cosine to FP32 0.36.
UNQUANTIZABLE_RANGE = 1e4


def unquantizable_nodes(model: onnx.ModelProto, ranges: TensorsData) -> dict[str, list[str]]:
    """Nodes to leave in float, so that the tensors 8-bit levels cannot resolve stay in float (a
    quantized node puts QuantizeLinear on its inputs and outputs), with a note when there are any:

    - ``tensors``: those whose calibrated range reaches ``UNQUANTIZABLE_RANGE`` (an attention
      mask's fill value, the scores it is added to), their producers and consumers in ``nodes``;
    - ``residual``: the Add feeding each LayerNormalization (the residual stream, whose few
      outlier channels, ±200 in MiniLM, set a scale that rounds the other channels to 0) and the
      LayerNormalization itself. A fused model (SkipLayerNormalization) never quantizes them.
    """
    extreme = set()
    for name, data in ranges.items():
        bounds = [np.asarray(getattr(data, side), dtype=np.float64) for side in ("lowest", "highest") if hasattr(data, side)]
        if any(bound.size and float(np.max(np.abs(bound))) >= UNQUANTIZABLE_RANGE for bound in bounds):
            extreme.add(name)
    nodes = {node.name for node in model.graph.node if node.name and extreme & {*node.input, *node.output}}
    producers = {output: node for node in model.graph.node for output in node.output}
    residual = set()
    for node in model.graph.node:
        if node.op_type == "LayerNormalization" and node.name:
            residual.add(node.name)
            feeding = producers.get(node.input[0])
            if feeding is not None and feeding.op_type == "Add" and feeding.name:
                residual.add(feeding.name)
    return {"tensors": sorted(extreme), "nodes": sorted(nodes | residual), "residual": sorted(residual)}


def unquantizable_notes(found: dict[str, list[str]]) -> list[str]:
    """What a report says about the nodes ``unquantizable_nodes`` found."""
    notes = []
    around = len(set(found["nodes"]) - set(found["residual"]))
    if around:
        notes.append(
            f"{around} node(s) left in float around {len(found['tensors'])} tensor(s) whose calibrated range reaches "
            f"{UNQUANTIZABLE_RANGE:g} (an attention mask's fill value, or scores it is added to), which 8-bit levels cannot resolve"
        )
    if found["residual"]:
        notes.append(
            f"{len(found['residual'])} LayerNormalization node(s) and the residual Adds feeding them left in float (outlier channels)"
        )
    return notes


# --------------------------------------------------------------------------- the cache


@dataclass
class RangesLookup:
    ranges: TensorsData
    status: str  # "hit", "miss", "corrupt" (an unreadable entry, recomputed) or "disabled"
    seconds: float


def cache_key(key_doc: dict[str, Any]) -> str:
    return sha256_json(key_doc)


def load_ranges(path: Path, key_doc: dict[str, Any], method: str) -> TensorsData | None:
    """The ranges stored at ``path``, or None when the entry is unreadable or for other inputs."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import TensorsData

    try:
        payload = json.loads(path.read_text())
        if payload.get("kiln") != json.loads(json.dumps(key_doc)):
            return None
        ranges = TensorsData.from_dict(payload)
        if ranges.calibration_method != CalibrationMethod[method] or not ranges.data:
            return None
        for data in ranges.values():
            data.range_value  # noqa: B018 - raises AttributeError when an entry lacks its bounds
    except Exception:  # noqa: BLE001 - any defect of a cache entry makes it a miss
        return None
    return ranges


def store_ranges(path: Path, ranges: TensorsData, key_doc: dict[str, Any] | None = None) -> None:
    """Write ``ranges`` in onnxruntime's calibration cache format, atomically."""
    from onnxruntime.quantization.calibrate import CalibrationCacheEncoder

    payload = ranges.to_dict()
    payload["smooth_quant"] = False  # quantize_static compares it with its own SmoothQuant flag
    if key_doc is not None:
        payload["kiln"] = key_doc
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(payload, out, cls=CalibrationCacheEncoder)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def ranges_for(
    cache_dir: Path | None,
    key_doc: dict[str, Any],
    method: str,
    compute: Callable[[], TensorsData],
) -> tuple[RangesLookup, str]:
    """The ranges for ``key_doc``: from ``cache_dir`` when a valid entry is there, else from
    ``compute()`` (then stored). Returns the lookup and the key."""
    key = cache_key(key_doc)
    started = time.perf_counter()
    status = "disabled"
    if cache_dir is not None:
        entry = Path(cache_dir) / f"{key}.json"
        status = "miss"
        if entry.exists():
            cached = load_ranges(entry, key_doc, method)
            if cached is not None:
                return RangesLookup(cached, "hit", round(time.perf_counter() - started, 3)), key
            status = "corrupt"
    ranges = compute()
    if cache_dir is not None:
        store_ranges(Path(cache_dir) / f"{key}.json", ranges, key_doc)
    return RangesLookup(ranges, status, round(time.perf_counter() - started, 3)), key
