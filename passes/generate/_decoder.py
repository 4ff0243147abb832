"""The torch side of ``decoder_export``: a wrapper that gives a transformers causal LM flat
key/value-cache inputs and outputs, its export with torch.onnx, and the parity check against
PyTorch on a prompt and one cached step.

Imported by ``decoder_export`` only when the pass runs: torch and transformers are heavy.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

PAST_KEY, PAST_VALUE = "past_key_values.%d.key", "past_key_values.%d.value"
PRESENT_KEY, PRESENT_VALUE = "present.%d.key", "present.%d.value"
#: (batch, past length, new tokens) of the traced example: a non-empty past, so that nothing
#: about the cache is specialized away
TRACE_SIZES = (2, 3, 4)


@dataclass(frozen=True)
class Shape:
    """What the cache looks like for this model."""

    model_type: str
    layers: int
    heads: int
    kv_heads: int
    head_size: int
    hidden: int
    vocab: int
    context: int


def shape_of(config: Any) -> Shape:
    """The cache's shape from a transformers config (GPT-2's n_* names included)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = int(getattr(text, "hidden_size", None) or text.n_embd)
    heads = int(getattr(text, "num_attention_heads", None) or text.n_head)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_size = int(getattr(text, "head_dim", None) or hidden // heads)
    layers = int(getattr(text, "num_hidden_layers", None) or text.n_layer)
    context = int(getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", 2048))
    return Shape(str(config.model_type), layers, heads, kv_heads, head_size, hidden, int(text.vocab_size), context)


class DecoderWithCache(torch.nn.Module):
    """``model`` called with a ``DynamicCache`` built from flat past tensors; returns logits and
    the flat present tensors (past and the new tokens' keys / values, concatenated)."""

    def __init__(self, model: torch.nn.Module, layers: int) -> None:
        super().__init__()
        self.model = model
        self.layers = layers

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache

        cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(self.layers)])
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, past_key_values=cache, use_cache=True
        )
        present = out.past_key_values
        flat: list[torch.Tensor] = []
        for layer in present.layers[: self.layers]:
            flat += [layer.keys, layer.values]
        return (out.logits, *flat)


def names(shape: Shape) -> tuple[list[str], list[str]]:
    """The exported model's input and output names, in order."""
    inputs = ["input_ids", "attention_mask", "position_ids"]
    outputs = ["logits"]
    for i in range(shape.layers):
        inputs += [PAST_KEY % i, PAST_VALUE % i]
        outputs += [PRESENT_KEY % i, PRESENT_VALUE % i]
    return inputs, outputs


def feeds(shape: Shape, ids: torch.Tensor, past: list[torch.Tensor], past_length: int) -> dict[str, torch.Tensor]:
    """The inputs for ``ids`` after ``past_length`` cached tokens (no padding)."""
    batch, seq = ids.shape
    tensors = {
        "input_ids": ids,
        "attention_mask": torch.ones(batch, past_length + seq, dtype=torch.int64),
        "position_ids": torch.arange(past_length, past_length + seq, dtype=torch.int64).expand(batch, seq).contiguous(),
    }
    input_names, _ = names(shape)
    for name, tensor in zip(input_names[3:], past, strict=True):
        tensors[name] = tensor
    return tensors


def empty_past(shape: Shape, batch: int, length: int, generator: torch.Generator | None = None) -> list[torch.Tensor]:
    size = (batch, shape.kv_heads, length, shape.head_size)
    if generator is None:
        return [torch.zeros(size) for _ in range(2 * shape.layers)]
    return [torch.randn(size, generator=generator) for _ in range(2 * shape.layers)]


def export(module: DecoderWithCache, shape: Shape, opset: int, path: Path) -> list[str]:
    """Export with the TorchScript exporter, batch / sequence / past axes dynamic; returns the
    exporter's warnings."""
    batch, past_length, seq = TRACE_SIZES
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, shape.vocab, (batch, seq), generator=generator)
    example = feeds(shape, ids, empty_past(shape, batch, past_length, generator), past_length)
    input_names, output_names = names(shape)
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch_size", 1: "sequence_length"},
        "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
        "position_ids": {0: "batch_size", 1: "sequence_length"},
        "logits": {0: "batch_size", 1: "sequence_length"},
    }
    for i in range(shape.layers):
        for template in (PAST_KEY, PAST_VALUE):
            axes[template % i] = {0: "batch_size", 2: "past_sequence_length"}
        for template in (PRESENT_KEY, PRESENT_VALUE):
            axes[template % i] = {0: "batch_size", 2: "total_sequence_length"}
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("always")
        torch.onnx.export(
            module,
            tuple(example[name] for name in input_names),
            str(path),
            dynamo=False,
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=axes,
            opset_version=opset,
            do_constant_folding=True,
        )
    module.eval()
    return sorted({str(w.message).splitlines()[0] for w in caught if str(w.message)})


def parity(module: DecoderWithCache, shape: Shape, path: Path, prompt: list[int], tolerance: float) -> dict[str, Any]:
    """ONNX (onnxruntime, CPU) against PyTorch: logits of ``prompt`` from an empty cache, then of
    one more token (PyTorch's greedy choice) with the cache the prompt left. Raises ValueError
    above ``tolerance``."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    wanted = [value.name for value in session.get_inputs()]
    _, output_names = names(shape)
    ids = torch.tensor([prompt], dtype=torch.int64)
    steps: list[tuple[str, float]] = []
    past = empty_past(shape, 1, 0)
    past_length = 0
    with torch.no_grad():
        for label in ("prompt", "cached step"):
            inputs = feeds(shape, ids, past, past_length)
            expected = [t.numpy() for t in module(*inputs.values())]
            got = session.run(output_names, {name: inputs[name].numpy() for name in wanted})
            diff = max(_max_abs(e, g) for e, g in zip(expected, got, strict=True))
            steps.append((label, diff))
            past = [torch.from_numpy(np.ascontiguousarray(t)) for t in got[1:]]
            past_length += ids.shape[1]
            ids = torch.from_numpy(expected[0][:, -1:].argmax(-1)).to(torch.int64)
    worst = max(diff for _, diff in steps)
    if worst > tolerance:
        where = max(steps, key=lambda step: step[1])[0]
        raise ValueError(f"onnxruntime and torch differ by up to {worst:.3g} ({where}), above parity_tolerance {tolerance:g}")
    return {"max_abs_diff": worst, "tolerance": tolerance, "steps": {label: diff for label, diff in steps}, "prompt_tokens": len(prompt)}


def _max_abs(expected: np.ndarray, actual: np.ndarray) -> float:
    if expected.shape != actual.shape:
        return float("inf")
    return float(np.abs(expected.astype(np.float64) - actual.astype(np.float64)).max()) if expected.size else 0.0
