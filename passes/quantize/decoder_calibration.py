"""Calibration batches for a decoder in the ``genai`` format (the model builder's folder: model.onnx
with a key/value cache, genai_config.json naming its inputs).

A workflow dataset of token ids (``input_ids``, and ``attention_mask`` when the tokenizer pads)
cannot feed the cache inputs, so every sample becomes one prefill, as Kiln's decode loop runs
one (``targets/onnxruntime/decoder.py``): its real tokens (the mask's ones; all of them without a
mask), a mask of ones, positions 0..n-1 when the model takes ``position_ids``, and every
``past_key_values.*`` input a zero-length cache ``[1, kv_heads, 0, head_size]`` in the model's
cache type. One sample per batch: the samples' lengths differ and a prefill has no padding.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.core import KilnError
from engine.core.data import Dataset
from passes.quantize.calibration import CalibrationFeed, model_inputs

if TYPE_CHECKING:
    import onnx

GENAI_CONFIG = "genai_config.json"


def decoder_names(folder: Path) -> dict[str, Any]:
    """What genai_config.json says of the decoder's inputs: their names, the past patterns, the
    layer count and the cache's head count and head size."""
    path = Path(folder) / GENAI_CONFIG
    try:
        decoder = json.loads(path.read_text())["model"]["decoder"]
        names = decoder.get("inputs", {})
        return {
            "input_ids": names.get("input_ids", "input_ids"),
            "attention_mask": names.get("attention_mask", "attention_mask"),
            "position_ids": names.get("position_ids", "position_ids"),
            "past_key": names.get("past_key_names", "past_key_values.%d.key"),
            "past_value": names.get("past_value_names", "past_key_values.%d.value"),
            "layers": int(decoder["num_hidden_layers"]),
            "kv_heads": int(decoder.get("num_key_value_heads", decoder.get("num_attention_heads"))),
            "head_size": int(decoder["head_size"]),
        }
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise KilnError(f"cannot read the decoder's inputs from {path}: {type(error).__name__}: {error}") from error


def decoder_feed(dataset: Dataset, name: str, graph: onnx.ModelProto, folder: Path, samples: int | None) -> CalibrationFeed:
    """One prefill batch per sample of ``dataset`` (the first ``samples``; all when None) for the
    decoder ``graph`` of the genai folder ``folder``."""
    layout = decoder_names(folder)
    inputs = model_inputs(graph)
    ids_name = layout["input_ids"]
    if ids_name not in dataset.inputs:
        raise KilnError(
            f"calibration dataset '{name}' has no input '{ids_name}' (token ids) to calibrate the decoder with; "
            f"the dataset's inputs: {', '.join(dataset.inputs) or 'none'}"
        )
    available = len(dataset)
    if samples is not None and available < samples:
        raise KilnError(f"calibration set has {available} samples, fewer than the {samples} asked (config.calibration_samples)")
    count = available if samples is None else samples
    if count == 0:
        raise KilnError(f"calibration dataset '{name}' has no samples")
    pasts = [pattern % i for i in range(layout["layers"]) for pattern in (layout["past_key"], layout["past_value"])]
    absent = [n for n in (ids_name, *pasts) if n not in inputs]
    if absent:
        raise KilnError(f"the decoder in {folder} has no input {', '.join(absent)} named in {GENAI_CONFIG}")
    unknown = sorted(set(inputs) - {ids_name, layout["attention_mask"], layout["position_ids"], *pasts})
    if unknown:
        raise KilnError(f"the decoder takes inputs a prefill does not feed: {', '.join(unknown)}")
    all_ids = np.asarray(dataset.inputs[ids_name])[:count]
    masks = np.asarray(dataset.inputs[layout["attention_mask"]])[:count] if layout["attention_mask"] in dataset.inputs else None
    batches = []
    for row in range(count):
        ids = all_ids[row] if masks is None else all_ids[row][masks[row].astype(bool)]
        if ids.size == 0:
            continue
        batches.append(_prefill(ids, inputs, layout, pasts))
    if not batches:
        raise KilnError(f"calibration dataset '{name}': every sample's attention mask is empty")
    digest = hashlib.sha256()
    for batch in batches:
        for input_name in sorted(batch):
            array = batch[input_name]
            digest.update(json.dumps([input_name, array.dtype.str, list(array.shape)]).encode())
            digest.update(np.ascontiguousarray(array).data)
    used = {ids_name, layout["attention_mask"]}
    ignored = sorted(n for n in dataset.inputs if n not in used)
    return CalibrationFeed(batches=batches, samples=len(batches), digest=digest.hexdigest(), ignored_inputs=ignored)


def _prefill(ids: np.ndarray, inputs: dict[str, np.dtype], layout: dict[str, Any], pasts: list[str]) -> dict[str, np.ndarray]:
    length = int(ids.size)
    feeds = {layout["input_ids"]: ids.astype(inputs[layout["input_ids"]])[None, :]}
    if layout["attention_mask"] in inputs:
        feeds[layout["attention_mask"]] = np.ones((1, length), dtype=inputs[layout["attention_mask"]])
    if layout["position_ids"] in inputs:
        feeds[layout["position_ids"]] = np.arange(length, dtype=inputs[layout["position_ids"]])[None, :]
    for past in pasts:
        feeds[past] = np.zeros((1, layout["kv_heads"], 0, layout["head_size"]), dtype=inputs[past])
    return feeds


def tie_cache_ranges(ranges_file: Path, folder: Path) -> list[str]:
    """Give every ``past_key_values.*`` input the range of the ``present.*`` output it is fed from
    in decoding, in the calibration ranges at ``ranges_file``; returns the pasts so tied.

    A prefill's past is empty, so its calibrated range says nothing (a zero-width range would
    quantize every cached value of a decode step to zero); what the cache holds in a decode step
    is what the previous step wrote as present."""
    from onnxruntime.quantization.calibrate import TensorsData

    from passes.quantize.calibration import store_ranges

    path = Path(folder) / GENAI_CONFIG
    names = json.loads(path.read_text())["model"]["decoder"]
    inputs, outputs = names.get("inputs", {}), names.get("outputs", {})
    layers = int(names["num_hidden_layers"])
    pairs = [
        (inputs.get(f"past_{kind}_names", f"past_key_values.%d.{kind}") % i, outputs.get(f"present_{kind}_names", f"present.%d.{kind}") % i)
        for i in range(layers)
        for kind in ("key", "value")
    ]
    ranges = TensorsData.from_dict(json.loads(ranges_file.read_text()))
    tied = []
    for past, present in pairs:
        if present in ranges.data:
            ranges.data[past] = ranges.data[present]
            tied.append(past)
    store_ranges(ranges_file, ranges)
    return tied
