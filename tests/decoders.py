"""Tiny causal language models for tests: a byte-level BPE tokenizer trained on a few lines of
English and a decoder with random weights from a transformers config, saved as a Hugging Face
folder (config.json, model.safetensors, tokenizer.json, generation_config.json).

Random weights are enough for shapes and for checking that a key/value-cache model continues a
prompt exactly as the PyTorch model does; quality figures need the trained example model
(``workflows/models/tiny_llm.py``).
"""

from __future__ import annotations

import codecs
import this
from pathlib import Path
from typing import Any

#: the families the decoder exports are tested on, with their transformers config class
FAMILIES = ("llama", "qwen2", "mistral", "phi3", "gpt2")

TEXT = codecs.decode(this.s, "rot13")


def tokenizer(vocab_size: int = 320) -> Any:
    """A byte-level BPE tokenizer (PreTrainedTokenizerFast) with ``<|endoftext|>`` as token 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([TEXT] * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>")


def config(family: str, vocab_size: int, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2) -> Any:
    import transformers

    common = {"vocab_size": vocab_size, "bos_token_id": 0, "eos_token_id": 0, "tie_word_embeddings": False}
    if family == "gpt2":
        return transformers.GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads, n_positions=256, **common)
    classes = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mistral": "MistralConfig", "phi3": "Phi3Config"}
    cls = getattr(transformers, classes[family])
    extra: dict[str, Any] = {"pad_token_id": 0} if family == "phi3" else {}
    return cls(
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        **common,
        **extra,
    )


def tiny_decoder(folder: Path, family: str = "llama", seed: int = 0, **sizes: int) -> Path:
    """Write a tiny random ``family`` decoder with its tokenizer into ``folder``; returns it."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = tokenizer()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config(family, len(tok), **sizes)).eval()
    folder = Path(folder)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def greedy(folder: Path, prompt: list[int], new_tokens: int) -> list[int]:
    """The PyTorch model's greedy continuation of ``prompt`` (``new_tokens`` tokens, EOS ignored)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return [int(t) for t in out[0, len(prompt) :]]


#: configurations users bring without tokenizer files: (family, transformers config class, extra fields)
BARE = {
    "llama": ("LlamaConfig", {}),
    # max_position_embeddings differs from original_max_position_embeddings (4096 by default)
    "phi3": ("Phi3Config", {"pad_token_id": 0}),
    "phi3_longrope": (
        "Phi3Config",
        {
            "pad_token_id": 0,
            "original_max_position_embeddings": 64,
            "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
        },
    ),
    "qwen2": ("Qwen2Config", {}),
    "gemma2": ("Gemma2Config", {"head_dim": 16, "sliding_window": 32}),
    # transformers' default window (4096) kept over a 512-token context
    "gemma2_default_window": ("Gemma2Config", {"head_dim": 16, "max_position_embeddings": 512}),
    "gemma3": ("Gemma3TextConfig", {"head_dim": 16, "sliding_window": 32}),
}


def bare_decoder(folder: Path, name: str, seed: int = 0) -> Path:
    """A tiny random decoder saved with ``save_pretrained`` and no tokenizer files (config.json,
    generation_config.json, model.safetensors), as a user builds one from a bare config."""
    import torch
    import transformers

    cls, extra = BARE[name]
    sizes = {"max_position_embeddings": 256, **extra}
    config = getattr(transformers, cls)(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=False,
        **sizes,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(Path(folder))
    return Path(folder)


def torch_logits(folder: Path, ids: list[int]) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()
