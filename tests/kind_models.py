"""Tiny models of each kind for tests: T5, BART and Whisper (encoder-decoders, from
tests/seq2seq_models.py), BERT (an encoder), Llama (a causal LM), from transformers configs with
random weights (2 layers, hidden 64), saved with save_pretrained. No tokenizer: what reads them
needs config.json and weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seq2seq_models import tiny_seq2seq

ENCODER_DECODERS = ("t5", "bart", "whisper")


def _configs() -> dict[str, Any]:
    import transformers

    small = {"vocab_size": 128}
    return {
        "bert": (
            transformers.BertModel,
            transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, **small),
        ),
        "llama": (
            transformers.LlamaForCausalLM,
            transformers.LlamaConfig(
                hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, **small
            ),
        ),
    }


def save_families(root: Path) -> dict[str, Path]:
    """Each family saved with save_pretrained into ``root``/<family> (random weights, 2 layers, hidden 64)."""
    import torch

    found = {name: tiny_seq2seq(root / name, name) for name in ENCODER_DECODERS}
    for name, (cls, config) in _configs().items():
        torch.manual_seed(0)
        cls(config).save_pretrained(root / name)
        found[name] = root / name
    return found
