"""Tiny models of each kind for tests: T5, BART and Whisper (encoder-decoders), BERT (an
encoder), Llama (a causal LM), from transformers configs with random weights (2 layers, hidden
64), saved with save_pretrained. No tokenizer: what reads them needs config.json and weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _configs() -> dict[str, Any]:
    import transformers

    small = {"vocab_size": 128}
    return {
        "t5": (
            transformers.T5ForConditionalGeneration,
            transformers.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4, **small),
        ),
        "bart": (
            transformers.BartForConditionalGeneration,
            transformers.BartConfig(
                d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64, **small,
            ),
        ),
        "whisper": (
            transformers.WhisperForConditionalGeneration,
            transformers.WhisperConfig(
                d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=32, max_target_positions=448,
                decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2, **small,
            ),
        ),
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
    }  # fmt: skip


def save_families(root: Path) -> dict[str, Path]:
    """Each family saved with save_pretrained into ``root``/<family> (random weights, 2 layers, hidden 64)."""
    import torch

    found = {}
    for name, (cls, config) in _configs().items():
        torch.manual_seed(0)
        cls(config).save_pretrained(root / name)
        found[name] = root / name
    return found
