"""The workflows `engine optimize` writes for generative models: a decoder (a causal LM) built by
ONNX Runtime GenAI's model builder and measured by generation, perplexity and logit fidelity; an
encoder-decoder (Whisper, T5, BART) exported as an encoder and a decoder with past and measured by
Kiln's greedy loop (first-step top-1 against FP32, tokens per second)."""

from __future__ import annotations

from typing import Any

from engine.optimize.model import ModelFacts
from engine.optimize.parts import CALIBRATION_LINES, HELDOUT, PROMPTS, SENTENCES, Choice, Pipeline

#: the kinds of model this module writes workflows for
KINDS = ("decoder", "seq2seq")
#: sources an encoder-decoder candidate's first-step top-1 is compared on: with 64, one disagreement still
#: keeps the bootstrap's lower 95% bound above 0.95 (the default bar); with 32 only none does
SEQ2SEQ_SOURCES = 64
#: held-out rows a decoder's logit fidelity compares on (the bar is on perplexity, judged on every row where it is near)
LOGIT_ROWS = 8


def steps(facts: ModelFacts, choice: Choice) -> Pipeline:
    return _decoder(choice) if facts.kind == "decoder" else _seq2seq(facts, choice)


def _decoder(choice: Choice) -> Pipeline:
    """A causal LM with its key/value cache, built by ONNX Runtime GenAI's model builder."""
    pipeline = Pipeline()
    # for CUDA the builder's FP32 decoder does not open (its Attention writes no present key/values)
    # and its FP32 GroupQueryAttention has no CUDA kernel: genai_build refuses it; FP16 is the reference
    cuda = choice.provider in ("cuda", "tensorrt")
    reference = "fp16" if cuda else "fp32"
    export = pipeline.add(
        f"the {reference.upper()} decoder with its key/value cache (GenAI's model builder): the reference",
        "export",
        "genai_build",
        None,
        config={"precision": reference},
    )
    if choice.precision in ("int4", "int8"):
        bits = 4 if choice.precision == "int4" else 8
        pipeline.add(
            f"the builder's own weight-only {choice.precision.upper()} (block sizes searched)",
            "builder_quant",
            "genai_build",
            None,
            config={"precision": choice.precision},
            search={"block_size": [32, 128]},
        )
        if not cuda:  # on the FP32 export (for CUDA the builder's own weights are the INT4 / INT8 candidates)
            pipeline.add(
                f"Kiln's {bits}-bit weights (MatMulNBits, round to nearest, int8 activations in the dot products) on the FP32 export",
                "weights",
                "int4_weights",
                export,
                config={"algorithm": "rtn", "bits": bits, "block_size": 32, "accuracy_level": 4},
            )
    elif choice.precision == "fp16" and not cuda:
        pipeline.add("the builder's FP16 model", "fp16", "genai_build", None, config={"precision": "fp16"})
    return pipeline


def _seq2seq(facts: ModelFacts, choice: Choice) -> Pipeline:
    """An encoder-decoder model: its encoder and its decoder with past, each quantized on its own (dynamic INT8: a
    static calibration would need the decoder's cache inputs)."""
    pipeline = Pipeline()
    export = pipeline.add(
        "the FP32 encoder and decoder with past key/values (torch.onnx's dynamo exporter; greedy tokens checked against "
        "PyTorch): the reference",
        "export",
        "seq2seq_export",
        None,
        config={"task": facts.task},
    )
    if choice.precision == "int8":
        pipeline.add(
            "dynamic INT8 of the encoder and of the decoder: activations quantized at run time, weights per tensor or per output channel",
            "int8",
            "ort_quantize",
            export,
            config={"mode": "dynamic"},
            search={"per_channel": [False, True]},
        )
    return pipeline


def data(facts: ModelFacts) -> dict[str, dict[str, Any]]:
    """The datasets: text Kiln ships, tokenized with the model's tokenizer, else synthetic."""
    if facts.kind == "decoder":
        return _decoder_data(facts)
    if not facts.tokenizer:  # an audio model's sources, and a text model's without a tokenizer, are the evaluators' own synthetic ones
        return {}
    line = {"source": "text_lines", "path": SENTENCES, "tokenizer": facts.tokenizer, "max_length": 64}
    return {"heldout": {**line, "split": {"take": "first", "count": CALIBRATION_LINES, "complement": True}}}


def _decoder_data(facts: ModelFacts) -> dict[str, dict[str, Any]]:
    """Prompts and held-out text shipped with Kiln, tokenized with the model's tokenizer; without one (a folder
    holding only config.json and weights), seeded random token ids of the same lengths."""
    if facts.tokenizer:
        return {
            "prompts": {"source": "text_lines", "path": PROMPTS, "tokenizer": "input", "max_length": 24, "padding": "longest", "limit": 8},
            "heldout": {"source": "text_lines", "path": HELDOUT, "tokenizer": "input", "max_length": 128, "padding": "longest"},
        }
    ids: dict[str, Any] = {"source": "synthetic", **({"int_high": facts.vocab_size} if facts.vocab_size else {})}
    return {
        "prompts": {**ids, "samples": 8, "sequence_length": 24, "seed": 0},
        "heldout": {**ids, "samples": 32, "sequence_length": facts.max_length, "seed": 1},
    }


def evaluate(facts: ModelFacts) -> list[dict[str, Any]]:
    if facts.kind == "decoder":
        return [
            {"id": "generation", "evaluator": "generation", "config": {"data": "prompts", "max_new_tokens": 16}},
            {"id": "perplexity", "evaluator": "perplexity", "config": {"data": "heldout"}},
            # no bar on it (it tells how the distributions differ): the rows the first look of a staged perplexity scores
            {"id": "fidelity", "evaluator": "logit_fidelity", "config": {"data": "heldout", "limit": LOGIT_ROWS}},
            {"id": "size", "evaluator": "size"},
        ]
    sources = {"data": "heldout"} if facts.tokenizer else {}
    return [
        {"id": "fidelity", "evaluator": "seq2seq_fidelity", "config": {**sources, "samples": SEQ2SEQ_SOURCES, "max_new_tokens": 8}},
        {"id": "generation", "evaluator": "seq2seq_generation", "config": {**sources, "samples": 4, "max_new_tokens": 16}},
        {"id": "size", "evaluator": "size"},
    ]


def select(facts: ModelFacts, choice: Choice) -> dict[str, Any]:
    if facts.kind == "decoder":
        return {
            "objective": {"metric": "generation.decode_tokens_per_s", "goal": "max"},
            "constraints": [{"metric": "perplexity.nll_increase", "max": choice.max_drop}],
        }
    return {
        "objective": {"metric": "generation.tokens_per_s", "goal": "max"},
        "constraints": [{"metric": "fidelity.top1_agreement", "min": round(1 - choice.max_drop, 6)}],
    }
