"""What kind of transformer a Hugging Face folder holds, read from its config.json alone (no torch,
no transformers): an encoder-decoder (T5, BART, Whisper: ``is_encoder_decoder``), a decoder (a
causal LM: Llama, GPT-2), or an encoder (BERT, RoBERTa, ViT). Passes declare the kinds they can
take (``Pass.model_kinds``); ``engine validate`` and the passes themselves refuse the others with
the pass or task that fits.

transformers' own mapping (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``) imports torch, which
``engine validate`` must not; the rule here reads what config.json says: ``is_encoder_decoder``,
``is_decoder``, the head its architectures name, and the families that exist only as decoders.
A config it cannot place gets no kind, and nothing is refused on it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ENCODER_DECODER, DECODER, ENCODER = "encoder-decoder", "decoder", "encoder"

#: class-name endings of a causal LM head
CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel")
#: class-name endings of an encoder's heads (with the bare ``...Model`` backbone)
ENCODER_HEADS = (
    "ForMaskedLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMultipleChoice",
    "ForImageClassification",
    "ForPreTraining",
    "ForCTC",
    "ForAudioClassification",
)
#: families whose backbone is a decoder (their bare ``...Model`` is a causal LM without its head)
DECODER_TYPES = frozenset(
    {
        "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi", "phi3", "phimoe", "gpt2",
        "gpt_neo", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "falcon", "gemma", "gemma2", "gemma3_text",
        "starcoder2", "olmo", "olmo2", "stablelm", "granite", "cohere", "deepseek_v3", "smollm3", "codegen", "mpt",
    }
)  # fmt: skip
#: families whose ``...ForConditionalGeneration`` takes speech (what task fits them)
SPEECH_TYPES = frozenset({"whisper", "speech_to_text", "speech-encoder-decoder", "moonshine", "seamless_m4t"})
#: config.json files larger than this are not read (a config is a few kilobytes)
MAX_CONFIG_BYTES = 4 << 20


def read_config(folder: Path | str) -> dict[str, Any] | None:
    """``folder/config.json`` parsed, or None when there is none or it cannot be read."""
    try:
        config = json.loads((Path(folder) / "config.json").read_bytes()[:MAX_CONFIG_BYTES])
    except (OSError, ValueError, RecursionError):
        return None
    return config if isinstance(config, dict) else None


def architectures(config: dict[str, Any]) -> list[str]:
    listed = config.get("architectures")
    return [a for a in listed if isinstance(a, str)] if isinstance(listed, list) else []


def kind_of(config: dict[str, Any] | None) -> str | None:
    """ENCODER_DECODER, DECODER or ENCODER for a parsed config.json; None when it cannot tell."""
    if not config:
        return None
    if config.get("is_encoder_decoder") is True:
        return ENCODER_DECODER
    names = architectures(config)
    model_type = config.get("model_type")
    if config.get("is_decoder") is True or any(n.endswith(CAUSAL_HEADS) for n in names) or model_type in DECODER_TYPES:
        return DECODER
    if names and all(n.endswith(ENCODER_HEADS) or (n.endswith("Model") and not n.endswith("PreTrainedModel")) for n in names):
        return ENCODER
    return None


def generation_task(config: dict[str, Any]) -> str:
    """The task an encoder-decoder is exported for: speech recognition for a speech model, else
    text-to-text generation (optimum's names)."""
    return "automatic-speech-recognition" if config.get("model_type") in SPEECH_TYPES else "text2text-generation"


def describe(config: dict[str, Any]) -> str:
    """``an encoder-decoder (model_type t5, T5ForConditionalGeneration)`` for messages."""
    kind = kind_of(config)
    article = "an" if kind in (ENCODER_DECODER, ENCODER) else "a"
    what = f"{article} {kind}" if kind else "a model"
    facts = [f"model_type {config.get('model_type')}"] if config.get("model_type") else []
    facts += architectures(config)[:1]
    return f"{what} ({', '.join(facts)})" if facts else what


#: for each kind a pass cannot take, the built-in pass that takes it
PASS_FOR_KIND = {ENCODER_DECODER: "seq2seq_export", DECODER: "decoder_export", ENCODER: "torch_export"}


def kind_refusal(pass_name: str, kinds: tuple[str, ...], config: dict[str, Any] | None, file: str) -> tuple[str, str] | None:
    """Why ``pass_name`` (taking ``kinds``) cannot take the model of ``config`` and the fix, or None
    when it can (or the kind is unknown)."""
    kind = kind_of(config)
    if not kinds or kind is None or kind in kinds or config is None:
        return None
    right = PASS_FOR_KIND[kind]
    if kind == ENCODER_DECODER:
        fix = f"use pass {right} (encoder and decoder with cross-attention and cache) with task {generation_task(config)}"
    elif kind == ENCODER:
        fix = f"use pass {right}: an encoder has no causal LM head to export"
    else:
        fix = f"use pass {right}"
    return f"{file} describes {describe(config)}, and {pass_name} takes only {' or '.join(kinds)} models", fix


#: files that hold a tokenizer's vocabulary (fast, SentencePiece, BPE, WordPiece, tiktoken)
TOKENIZER_VOCABULARY = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tiktoken.model",
)
#: files that configure a tokenizer without holding its vocabulary
TOKENIZER_SETTINGS = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def orphan_tokenizer_settings(folder: str | Path) -> str | None:
    """The first tokenizer settings file of a Hugging Face folder that holds no vocabulary file,
    else None. From such settings transformers makes up a tokenizer with an empty vocabulary for
    some model types (Gemma), which would pass for the model's."""
    folder = Path(folder)
    if any((folder / name).is_file() for name in TOKENIZER_VOCABULARY):
        return None
    return next((name for name in TOKENIZER_SETTINGS if (folder / name).is_file()), None)


TOKENIZER_WHY = "tokenizer settings without a vocabulary: transformers would make up an empty tokenizer, not the model's"


def tokenizer_fix(settings: str) -> str:
    return (
        f"add the model's tokenizer files (one of {', '.join(TOKENIZER_VOCABULARY)}), "
        f"or remove {settings} for a model without a tokenizer (its token ids are then synthetic)"
    )
