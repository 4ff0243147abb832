"""The torch side of ``seq2seq_export``: an encoder-decoder model (Whisper, T5, BART, Marian) as two
modules with flat inputs and outputs, their export with torch.onnx, and the greedy decode in
PyTorch that the export is checked against.

- **encoder**: ``input_ids`` + ``attention_mask`` (text) or ``input_features`` (audio) ->
  ``encoder_hidden_states`` and, per decoder layer, the cross-attention keys and values
  (``present.N.encoder.key / .value``). They are computed once per input here, by one call of the
  decoder on the encoder's output that fills the library's cross-attention cache: the exporter
  keeps only the nodes those outputs depend on (the layers' key / value projections), so the
  decoder part never recomputes them and needs no branch for a first step.
- **decoder**: ``decoder_input_ids``, ``encoder_hidden_states``, ``encoder_attention_mask`` (text),
  ``past_key_values.N.decoder.key / .value`` (self-attention, empty on the first step) and
  ``past_key_values.N.encoder.key / .value`` (from the encoder part) -> ``logits`` and
  ``present.N.decoder.key / .value`` (the past with the new tokens appended).

Imported by ``seq2seq_export`` only when the pass runs: torch and transformers are heavy.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import Any

import torch

PAST_SELF = ("past_key_values.%d.decoder.key", "past_key_values.%d.decoder.value")
PAST_CROSS = ("past_key_values.%d.encoder.key", "past_key_values.%d.encoder.value")
PRESENT_SELF = ("present.%d.decoder.key", "present.%d.decoder.value")
PRESENT_CROSS = ("present.%d.encoder.key", "present.%d.encoder.value")
#: the traced example: (batch, source length, decoder tokens, self-attention past); a non-empty past
#: and sizes that differ from each other, so that nothing about them is specialized away
TRACE_SIZES = (2, 7, 3, 4)


def _cache(model: torch.nn.Module, data: list[tuple[torch.Tensor, ...]] | None = None) -> Any:
    from transformers import DynamicCache, EncoderDecoderCache

    if data is None:  # layers made as the decoder fills them (a config's num_hidden_layers may count the encoder's)
        return EncoderDecoderCache(DynamicCache(), DynamicCache())
    return EncoderDecoderCache(data)


class EncoderPart(torch.nn.Module):
    """The encoder, and the cross-attention keys and values of every decoder layer."""

    def __init__(self, model: torch.nn.Module, audio: bool, start_token: int) -> None:
        super().__init__()
        self.model, self.audio, self.start_token = model, audio, start_token

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inputs, attention_mask = tensors[0], (None if self.audio else tensors[1])
        encoder = self.model.get_encoder()
        if self.audio:
            hidden = encoder(input_features=inputs).last_hidden_state
        else:
            hidden = encoder(input_ids=inputs, attention_mask=attention_mask).last_hidden_state
        start = torch.full((hidden.shape[0], 1), self.start_token, dtype=torch.int64)
        cache = _cache(self.model)
        mask = {} if self.audio else {"encoder_attention_mask": attention_mask}
        self.model.get_decoder()(input_ids=start, encoder_hidden_states=hidden, cache=cache, use_cache=True, **mask)
        flat = [hidden]
        for layer in cache.cross_attention_cache.layers:
            flat += [layer.keys, layer.values]
        return tuple(flat)


class DecoderPart(torch.nn.Module):
    """One decoder step over the self-attention past, with the cross-attention cache given."""

    def __init__(self, model: torch.nn.Module, layers: int, audio: bool) -> None:
        super().__init__()
        self.model, self.layers, self.audio = model, layers, audio

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        decoder_input_ids, encoder_hidden_states, rest = tensors[0], tensors[1], tensors[2:]
        mask = None if self.audio else rest[0]
        past = rest if self.audio else rest[1:]
        cache = _cache(self.model, [tuple(past[4 * i : 4 * i + 4]) for i in range(self.layers)])
        out = self.model(
            encoder_outputs=(encoder_hidden_states,),
            attention_mask=mask,
            decoder_input_ids=decoder_input_ids,
            cache=cache,
            use_cache=True,
        )
        flat = [out.logits]
        for layer in cache.self_attention_cache.layers[: self.layers]:
            flat += [layer.keys, layer.values]
        return tuple(flat)


def encoder_names(layers: int, audio: bool) -> tuple[list[str], list[str]]:
    inputs = ["input_features"] if audio else ["input_ids", "attention_mask"]
    outputs = ["encoder_hidden_states"]
    for i in range(layers):
        outputs += [name % i for name in PRESENT_CROSS]
    return inputs, outputs


def decoder_names(layers: int, audio: bool) -> tuple[list[str], list[str]]:
    inputs = ["decoder_input_ids", "encoder_hidden_states"] + ([] if audio else ["encoder_attention_mask"])
    outputs = ["logits"]
    for i in range(layers):
        inputs += [name % i for name in (*PAST_SELF, *PAST_CROSS)]
        outputs += [name % i for name in PRESENT_SELF]
    return inputs, outputs


def example_source(config: Any, batch: int, length: int, audio: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    """Encoder inputs: random token ids (a full mask), or random log-mel features
    ``[batch, num_mel_bins, 2 * max_source_positions]`` (the length Whisper's encoder requires)."""
    generator = torch.Generator().manual_seed(seed)
    if audio:
        frames = 2 * int(config.max_source_positions)
        return {"input_features": torch.randn((batch, int(config.num_mel_bins), frames), generator=generator)}
    ids = torch.randint(0, int(config.vocab_size), (batch, length), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _export(
    module: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    names: tuple[list[str], list[str]],
    axes: dict[str, dict[int, str]],
    opset: int,
    path: Path,
) -> list[str]:
    """torch.onnx's dynamo exporter (torch.export), the axes of ``axes`` dynamic (one dimension per
    label, shared); the TorchScript exporter cannot trace Whisper (``aten::diff`` at opset 17).
    Returns the exporter's warnings."""
    dims: dict[str, Any] = {}
    specs = []
    for name in names[0]:
        given = axes.get(name)
        specs.append({axis: dims.setdefault(label, torch.export.Dim(label)) for axis, label in given.items()} if given else None)
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("always")
        torch.onnx.export(
            module,
            example,
            str(path),
            input_names=names[0],
            output_names=names[1],
            dynamic_shapes=(tuple(specs),),
            opset_version=opset,
            dynamo=True,
            external_data=True,
            optimize=True,
            verbose=False,
            report=False,
        )
    module.eval()
    return sorted({str(w.message).splitlines()[0] for w in caught if str(w.message)})


def export_parts(
    model: torch.nn.Module, audio: bool, start_token: int, opset: int, folder: Path
) -> tuple[int, list[str]]:  # long: two exports with their axes
    """Export the encoder part to ``folder/encoder.onnx`` and the decoder part to
    ``folder/decoder.onnx``; the number of decoder layers and the exporters' warnings."""
    batch, length, tokens, past_length = TRACE_SIZES
    source = example_source(model.config, batch, length, audio)
    encoder = EncoderPart(model, audio, start_token).eval()
    with torch.no_grad():
        hidden, *cross = encoder(*source.values())
    layers = len(cross) // 2
    enc_in, enc_out = encoder_names(layers, audio)
    enc_axes: dict[str, dict[int, str]] = {name: {0: "batch_size"} for name in enc_in}
    if not audio:  # Whisper's encoder takes exactly 2 * max_source_positions frames
        for name in enc_in:
            enc_axes[name][1] = "encoder_sequence_length"
    found = _export(encoder, tuple(source.values()), (enc_in, enc_out), enc_axes, opset, folder / "encoder.onnx")

    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, int(model.config.vocab_size), (batch, tokens), generator=generator)
    heads, head_size = cross[0].shape[1], cross[0].shape[3]
    past: list[torch.Tensor] = []
    for i in range(layers):
        past += [torch.randn((batch, heads, past_length, head_size), generator=generator) for _ in range(2)]
        past += [cross[2 * i], cross[2 * i + 1]]
    decoder = DecoderPart(model, layers, audio).eval()
    dec_in, dec_out = decoder_names(layers, audio)
    example = (ids, hidden) + (() if audio else (source["attention_mask"],)) + tuple(past)
    enc_length = {} if audio else {1: "encoder_sequence_length"}
    dec_axes: dict[str, dict[int, str]] = {
        "decoder_input_ids": {0: "batch_size", 1: "decoder_sequence_length"},
        "encoder_hidden_states": {0: "batch_size", **enc_length},
        "encoder_attention_mask": {0: "batch_size", **enc_length},
    }
    for i in range(layers):
        for name in PAST_SELF:
            dec_axes[name % i] = {0: "batch_size", 2: "past_decoder_sequence_length"}
        for name in PAST_CROSS:
            dec_axes[name % i] = {0: "batch_size", **({} if audio else {2: "encoder_sequence_length"})}
    found += _export(decoder, example, (dec_in, dec_out), dec_axes, opset, folder / "decoder.onnx")
    return layers, sorted(set(found))


def torch_greedy(model: torch.nn.Module, source: dict[str, torch.Tensor], prompt: list[int], max_new_tokens: int) -> tuple[list[int], Any]:
    """Greedy tokens from PyTorch's forward (argmax, no logits processors, no stop at end of
    sequence) with the library's own cache, and the logits of the first step ``[len(prompt), vocab]``."""
    ids = torch.tensor([prompt], dtype=torch.int64)
    tokens: list[int] = []
    first = None
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(**source)
        cache = _cache(model)
        mask = source.get("attention_mask")
        for _ in range(max_new_tokens):
            out = model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=ids, cache=cache, use_cache=True)
            if first is None:
                first = out.logits[0].numpy()
            token = int(out.logits[0, -1].argmax())
            tokens.append(token)
            ids = torch.tensor([[token]], dtype=torch.int64)
    return tokens, first
