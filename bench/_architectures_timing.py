"""bench/architectures.py's harness: one timing code for both tools' ONNX files.

Synthetic feeds are built from each ONNX file's own input signature, not from what either tool
says about it, so the same code feeds Optimum's and Kiln's files: batch 1, ``sequence`` new
tokens, past key/values of ``past`` positions (an attention mask over both), pixel inputs of the
model's image size, Whisper's ``input_features`` of its mel bins and frames. A model made of
several files (encoder, decoder, decoder with past) is timed as one pass through each file, the
times summed. FP32 and INT8 are timed in interleaved rounds (the order alternating), each
round's figure the median of its runs; the speedup is the median of the per-round ratios with
its bootstrap interval (engine/core/stats.py), so a busy neighbour that slows one round slows
both sides of its ratio.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: ONNX tensor element types onnxruntime names, as numpy dtypes
DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(bool)": "bool",
}


@dataclass(frozen=True)
class Shapes:
    """What symbolic dimensions resolve to: the bench's sizes and the model's own (config.json)."""

    batch: int = 1
    sequence: int = 32
    past: int = 32
    #: the encoder's length (T5: its source tokens; Whisper: max_source_positions)
    encoder: int = 32
    #: a key/value head's width (config.json's head_dim, else hidden size / heads)
    head: int = 64
    side: int = 64
    channels: int = 3
    mels: int = 80
    frames: int = 3000
    vocab: int = 100


def shapes_for(
    config: dict[str, Any], sequence: int = 32, past: int = 32, processor: dict[str, Any] | None = None, source: int = 32
) -> Shapes:
    """The sizes for a model whose config.json is ``config``: ``source`` tokens into a text encoder
    of an encoder-decoder; images of its image processor's size (preprocessor_config.json, as both
    tools' users feed it), else of config.json's ``image_size`` (ConvNeXt's says 224 whatever the
    processor does), else 224."""
    vocab = min(int(config.get("vocab_size") or 100), 100)
    hidden = config.get("hidden_size") or config.get("d_model") or 64
    heads = config.get("num_attention_heads") or config.get("num_heads") or config.get("decoder_attention_heads") or 1
    head = int(config.get("head_dim") or config.get("d_kv") or hidden // heads)
    if config.get("model_type") == "whisper":
        positions = int(config.get("max_source_positions", 1500))
        mels = int(config.get("num_mel_bins", 80))
        return Shapes(sequence=sequence, past=past, encoder=positions, head=head, mels=mels, frames=2 * positions, vocab=vocab)
    size = (processor or {}).get("size")
    side = size.get("height", size.get("shortest_edge")) if isinstance(size, dict) else size
    if not isinstance(side, int):
        image = config.get("image_size")
        side = image if isinstance(image, int) else 224
    return Shapes(sequence=sequence, past=past, encoder=source, head=head, side=side, vocab=vocab)


def dimension(name: str, shapes: Shapes) -> int:
    """The size of a symbolic dimension, by its name: ``past_sequence_length + 1`` is summed term by term."""
    if "+" in name:
        return sum(dimension(term.strip(), shapes) for term in name.split("+"))
    low = name.lower()
    if low.isdigit():
        return int(low)
    rules: tuple[tuple[tuple[str, ...], int], ...] = (
        (("batch",), shapes.batch),
        (("kv_cache_dim", "head_size", "head_dim"), shapes.head),
        (("total",), shapes.past + shapes.sequence),
        (("encoder",), shapes.encoder),
        (("past",), shapes.past),
        (("channel",), shapes.channels),
        (("height", "width"), shapes.side),
        (("feature_size", "mel"), shapes.mels),
        (("frames",), shapes.frames),
    )
    for words, size in rules:
        if any(word in low for word in words):
            return size
    return shapes.sequence


def _shape(input_name: str, dims: Sequence[Any], shapes: Shapes) -> list[int]:
    """Concrete dims: fixed ones kept, symbolic ones by name, then by the input's role where names say nothing."""
    out = [d if isinstance(d, int) and d > 0 else dimension(str(d or ""), shapes) for d in dims]
    role_dims: dict[str, list[int]] = {
        "input_features": [shapes.batch, shapes.mels, shapes.frames],
        "pixel_values": [shapes.batch, shapes.channels, shapes.side, shapes.side],
    }
    wanted = role_dims.get(input_name)
    if wanted and len(wanted) == len(out):
        out = [d if isinstance(d, int) and d > 0 else w for d, w in zip(dims, wanted, strict=True)]
    if input_name.startswith("encoder_") and len(out) >= 2 and not (isinstance(dims[1], int) and dims[1] > 0):
        out[1] = shapes.encoder  # encoder_hidden_states / encoder_attention_mask: the encoder's length
    if out and out[0] != shapes.batch and not (isinstance(dims[0], int) and dims[0] > 0):
        out[0] = shapes.batch
    return out


def _values(name: str, dtype: str, shape: list[int], shapes: Shapes, rng: Any, has_past: bool) -> Any:
    import numpy as np

    low = name.lower()
    if dtype == "bool":
        return np.full(shape, has_past, dtype=bool)  # use_cache_branch of a merged decoder
    if dtype.startswith("int"):
        if "mask" in low:
            return np.ones(shape, dtype=dtype)
        if "position" in low or low == "cache_position":
            last = shape[-1] if shape else 1
            start = max(0, (shapes.past if has_past else 0) + shapes.sequence - last)
            return np.broadcast_to(np.arange(start, start + last, dtype=dtype), shape).copy()
        if "token_type" in low:
            return np.zeros(shape, dtype=dtype)
        if "ids" in low:
            return rng.integers(1, shapes.vocab, size=shape).astype(dtype)
        return np.full(shape, shapes.past + shapes.sequence if "length" in low else 0, dtype=dtype)
    return rng.standard_normal(shape).astype(dtype)


def feeds(inputs: Sequence[Any], shapes: Shapes, seed: int = 0) -> dict[str, Any]:
    """Synthetic feeds for ``inputs`` (onnxruntime's NodeArg list: name, type, shape)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    has_past = any(re.search(r"past|cache\.|key_values", i.name) for i in inputs) and shapes.past > 0
    out = {}
    for node in inputs:
        dtype = DTYPES.get(node.type)
        if dtype is None:
            raise ValueError(f"input {node.name}: type {node.type} is not one this harness feeds")
        shape = _shape(node.name, list(node.shape or []), shapes)
        out[node.name] = _values(node.name, dtype, shape, shapes, rng, has_past)
    return out


def session(path: Path, threads: int) -> Any:
    """An onnxruntime CPU session with ``threads`` intra-op threads, one inter-op thread."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def runner(files: Sequence[Path], shapes: Shapes, threads: int) -> Callable[[], None]:
    """One pass through each of ``files`` (sessions opened and feeds built once)."""
    parts = []
    for path in files:
        opened = session(path, threads)
        parts.append((opened, feeds(opened.get_inputs(), shapes)))

    def one_pass() -> None:
        for opened, feed in parts:
            opened.run(None, feed)

    return one_pass


def _round(call: Callable[[], None], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def interleaved(fp32: Callable[[], None], int8: Callable[[], None], rounds: int, runs: int, warmup: int = 5) -> dict[str, Any]:
    """FP32 and INT8 timed in alternating rounds: each round's median per model, and the speedup
    (median of the per-round FP32 / INT8 ratios) with its 95% bootstrap interval over rounds."""
    from engine.core.stats import bootstrap

    for _ in range(warmup):
        fp32()
        int8()
    medians: dict[str, list[float]] = {"fp32": [], "int8": []}
    for index in range(rounds):
        order = (("fp32", fp32), ("int8", int8)) if index % 2 == 0 else (("int8", int8), ("fp32", fp32))
        for name, call in order:
            medians[name].append(_round(call, runs))
    ratios = [a / b for a, b in zip(medians["fp32"], medians["int8"], strict=True)]
    interval = bootstrap(ratios, statistic="median")
    return {
        "fp32_ms": statistics.median(medians["fp32"]) * 1e3,
        "int8_ms": statistics.median(medians["int8"]) * 1e3,
        "speedup": interval.estimate,
        "low": interval.low,
        "high": interval.high,
        "rounds": rounds,
        "runs_per_round": runs,
        "ratios": [round(r, 4) for r in ratios],
    }


def first_error_line(text: str) -> str:
    """The line of a tool's output that says what went wrong: a traceback's last exception line,
    else the first line naming an error or a refusal, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return "(no output)"
    if any(line.startswith("Traceback") for line in lines):
        raised = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b:?", line)]
        if raised:
            return raised[-1][:300]
    for line in lines:
        if re.search(r"\berror\b|refused|cannot|failed", line, re.IGNORECASE) and "warning" not in line.lower():
            return line[:300]
    return lines[-1][:300]
