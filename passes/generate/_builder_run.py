"""Runs ONNX Runtime GenAI's model builder (``python -m onnxruntime_genai.models.builder``) in
the ``genai_build`` subprocess, with what a folder without tokenizer files needs.

``python _builder_run.py [--no-tokenizer FOLDER] BUILDER-ARGS...``: with ``--no-tokenizer`` the
builder's calls of ``AutoTokenizer.from_pretrained`` on FOLDER get ``NoTokenizer``, which has no
vocabulary, no special tokens and saves nothing, so the token ids in genai_config.json come from
the model's config alone and the output folder holds no tokenizer files. Without it transformers
either fails (no tokenizer files) or, for some model types (Gemma), makes up a tokenizer with an
empty vocabulary whose ``<eos>`` the builder would add to the model's end-of-sequence ids and
whose files it would save beside the model as if they were the model's.

Run as a script by path: it imports nothing of Kiln.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any


class NoTokenizer:
    """Stands for a tokenizer the model does not have: an empty vocabulary and no special tokens."""

    bos_token_id = eos_token_id = pad_token_id = None
    bos_token = eos_token = pad_token = None
    model_max_length = 0

    def get_vocab(self) -> dict[str, int]:
        return {}

    def convert_tokens_to_ids(self, tokens: Any) -> None:
        return None

    def save_pretrained(self, *args: Any, **kwargs: Any) -> tuple[str, ...]:
        print("No tokenizer files in the input folder: none written")
        return ()


def _patch_tokenizer(folder: str) -> None:
    import transformers

    original = transformers.AutoTokenizer.from_pretrained
    target = os.path.realpath(folder)

    def from_pretrained(name: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(name, (str, os.PathLike)) and os.path.realpath(name) == target:
            return NoTokenizer()
        return original(name, *args, **kwargs)

    transformers.AutoTokenizer.from_pretrained = from_pretrained  # type: ignore[method-assign]


def adjust_config(config: Any) -> Any:
    """The config as the builder reads it, where transformers 5 lays it out otherwise (the model
    is the same):

    - Phi-3: the builder picks its LongRoPE class whenever ``max_position_embeddings`` differs
      from ``original_max_position_embeddings`` (4096 unless the config says otherwise), and that
      class reads its caches from longrope parameters only (``KeyError: 'multi_cache'``). With
      any other RoPE type ``original_max_position_embeddings`` changes nothing in the model:
      it is set to ``max_position_embeddings``, which selects the builder's plain Phi-3 class.
    - Gemma 3: transformers 5 keeps one RoPE dict per layer type in ``rope_parameters``
      (``sliding_attention``, ``full_attention``); the builder reads a flat dict (the global
      layers') and ``rope_local_base_freq`` (the sliding layers' theta).
    - A sliding window longer than the context (a config that keeps transformers' default window,
      Gemma 2's 4096, over ``max_position_embeddings`` 512): no position can look further back than
      the context, so a window of the context's length is the same model; the builder would bake
      the longer window into every attention node (``local_window_size``) and ask for a cache that
      long, which GenAI refuses ("max_length (4096) cannot be greater than model context_length (512)").
    """
    window, context = getattr(config, "sliding_window", None), getattr(config, "max_position_embeddings", None)
    if isinstance(window, int) and isinstance(context, int) and 0 < context < window:
        config.sliding_window = context
    rope = getattr(config, "rope_parameters", None)
    if getattr(config, "model_type", None) == "phi3" and isinstance(rope, dict) and rope.get("rope_type") != "longrope":
        config.original_max_position_embeddings = config.max_position_embeddings
    if isinstance(rope, dict) and "full_attention" in rope and "sliding_attention" in rope and "rope_type" not in rope:
        if getattr(config, "model_type", None) in ("gemma3", "gemma3_text"):
            config.rope_local_base_freq = rope["sliding_attention"].get("rope_theta", 10000.0)
            config.rope_parameters = dict(rope["full_attention"])
            config.rope_theta = config.rope_parameters.get("rope_theta", 10000.0)
    return config


def _patch_config() -> None:
    import transformers

    original = transformers.AutoConfig.from_pretrained

    def from_pretrained(*args: Any, **kwargs: Any) -> Any:
        return adjust_config(original(*args, **kwargs))

    transformers.AutoConfig.from_pretrained = from_pretrained  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    _patch_config()
    if argv[:1] == ["--no-tokenizer"]:
        _patch_tokenizer(argv[1])
        argv = argv[2:]
    sys.argv = ["onnxruntime_genai.models.builder", *argv]
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
