"""Tiny encoder-decoder models (Whisper, T5, BART, Marian) from transformers configs with random
weights, saved with save_pretrained: 2 layers, d_model 64, a vocabulary of 128, no tokenizer
files (the export and the evaluators work on synthetic token ids and audio features)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

VOCAB = 128

FAMILIES = ("whisper", "t5", "bart", "marian")


def _config(transformers: Any, family: str) -> Any:
    common = {"vocab_size": VOCAB, "pad_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 1}
    if family == "whisper":
        return transformers.WhisperConfig(
            **common,
            bos_token_id=1,
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            num_mel_bins=16,
            max_source_positions=24,
            max_target_positions=64,
            begin_suppress_tokens=None,
            suppress_tokens=None,
        )
    if family == "t5":
        return transformers.T5Config(
            **{**common, "decoder_start_token_id": 0},
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
        )
    config_class = transformers.BartConfig if family == "bart" else transformers.MarianConfig
    return config_class(
        **common,
        bos_token_id=1,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=64,
        forced_eos_token_id=None,
    )


def tiny_seq2seq(folder: Path, family: str, seed: int = 0) -> Path:
    """A random-weight model of ``family`` saved in ``folder``."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = _config(transformers, family)
    if family == "whisper":
        model = transformers.WhisperForConditionalGeneration(config)
    elif family == "t5":
        model = transformers.T5ForConditionalGeneration(config)
    elif family == "bart":
        model = transformers.BartForConditionalGeneration(config)
    else:
        model = transformers.MarianMTModel(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(folder)
    return folder
