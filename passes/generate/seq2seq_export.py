"""Export a Hugging Face encoder-decoder model (Whisper, T5, BART, Marian) with its key/value cache
into a ``seq2seq`` folder: an encoder and a decoder with past, run by a greedy loop.

- ``encoder.onnx``: ``input_ids`` + ``attention_mask`` (text) or ``input_features`` (audio,
  ``[batch, num_mel_bins, 2 * max_source_positions]``) -> ``encoder_hidden_states`` and the
  cross-attention keys and values of every decoder layer (``present.N.encoder.key / .value``),
  computed once per source.
- ``decoder.onnx``: ``decoder_input_ids``, ``encoder_hidden_states``, ``encoder_attention_mask``
  (text), ``past_key_values.N.decoder.key / .value`` (self-attention; empty on the first step,
  ``[batch, heads, 0, head_size]``) and ``past_key_values.N.encoder.key / .value`` -> ``logits``
  and ``present.N.decoder.key / .value``. One model serves the first step and the following ones:
  the first step's cross-attention keys and values come from the encoder part, so the decoder needs
  no branch (Optimum's merged decoder has an ``If`` on ``use_cache_branch`` instead).
- ``seq2seq.json`` names both with their inputs and outputs and the start and end tokens;
  ``config.json``, ``generation_config.json`` and the tokenizer's files (when the input has them)
  are copied beside.

The export is written on torch.onnx's dynamo exporter (``passes.generate._seq2seq``): Optimum's
ONNX exporters (``optimum-onnx``, the library made for this) pin transformers below 4.58 and
cannot share an environment with transformers 5, and the export checks parity against the
transformers the workflow runs. The TorchScript exporter fails on Whisper (``aten::diff``).

Parity: the first step's logits and ``parity_tokens`` greedy tokens of the exported parts under
onnxruntime against PyTorch's forward on a synthetic source (random token ids, or random log-mel
features for audio); the pass fails above ``parity_tolerance`` or on a different token.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from engine.core import ModelArtifact, PassConfig, PassContext, PassResult
from engine.core.refs import InputTask
from passes.common.pass_io import require
from passes.common.seq2seq_folder import MANIFEST, Seq2SeqPass, manifest, save_part

TASKS = ("text2text-generation", "automatic-speech-recognition")
#: model types whose source is audio features (``input_features``), not token ids
AUDIO_TYPES = ("whisper",)
#: files of the input folder copied beside the models (the tokenizer's, when it has them)
SIDE_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "source.spm",
    "target.spm",
    "preprocessor_config.json",
    "added_tokens.json",
    "normalizer.json",
)


class Seq2SeqExport(Seq2SeqPass):
    name = "seq2seq_export"
    summary = (
        "Export a Hugging Face encoder-decoder model (Whisper, T5, BART, Marian) as an encoder and a decoder with past "
        "key/values through torch.onnx (dynamo) into a seq2seq folder, checked against PyTorch's greedy tokens."
    )
    version = "1"
    model_kinds = ("encoder-decoder",)
    accepts = ("hf",)
    libraries = ("torch", "transformers", "onnx", "onnxruntime", "onnxscript")

    class Config(PassConfig):
        task: InputTask[Literal["auto", "text2text-generation", "automatic-speech-recognition"]] = Field(
            "auto",
            description="text2text-generation (T5, BART, Marian: token ids in) or automatic-speech-recognition (Whisper: audio features in); auto: from the model's type.",
        )
        opset: int = Field(18, ge=18, le=23, description="ONNX opset the dynamo exporter writes (18 to 23).")
        check_parity: bool = Field(True, description="Compare onnxruntime's logits and greedy tokens with PyTorch's; fail on a difference.")
        parity_tokens: int = Field(8, ge=1, le=256, description="Greedy tokens compared with PyTorch's.")
        parity_tolerance: float = Field(
            1e-3, gt=0, description="Largest absolute difference of the first step's logits allowed between onnxruntime and PyTorch."
        )

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:  # long: load, export, save, check
        cfg = self.config
        (transformers,) = require("transformers", self.name, "transformers")
        require("onnx", self.name, "onnx")
        import torch

        from passes.common.graph_tools import quiet_library
        from passes.generate import _seq2seq

        source = Path(model.path)
        config = _config(transformers, source)
        audio = _is_audio(config, cfg.task, source)
        start = _start_token(config, source)
        out, scratch = Path(ctx.output_dir), Path(ctx.workdir) / "export"
        out.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        started = time.perf_counter()
        with quiet_library() as messages:
            transformers.utils.logging.disable_progress_bar()
            auto = transformers.AutoModelForSpeechSeq2Seq if audio else transformers.AutoModelForSeq2SeqLM
            torch.manual_seed(0)
            lm = auto.from_pretrained(str(source), attn_implementation="eager", dtype=torch.float32, local_files_only=True).eval()
            layers, warnings = _seq2seq.export_parts(lm, audio, start, cfg.opset, scratch)
            files = {part: save_part(scratch / f"{part}.onnx", out, part) for part in ("encoder", "decoder")}
            shutil.rmtree(scratch)
        names = {"encoder": _seq2seq.encoder_names(layers, audio), "decoder": _seq2seq.decoder_names(layers, audio)}
        document = manifest(lm, "automatic-speech-recognition" if audio else "text2text-generation", layers, start, files, names)
        (out / MANIFEST).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        lm.config.to_json_file(str(out / "config.json"))
        copied = [name for name in SIDE_FILES if (source / name).is_file()]
        for name in copied:
            shutil.copyfile(source / name, out / name)
        seconds = round(time.perf_counter() - started, 3)
        notes: list[str] = []
        parity: dict[str, Any] | None = None
        if cfg.check_parity:
            parity = _parity(lm, audio, out, cfg.parity_tokens, cfg.parity_tolerance)
        else:
            notes.append("parity with PyTorch not checked (check_parity: false)")
        details: dict[str, Any] = {
            "exporter": "dynamo",
            "opset": cfg.opset,
            "task": document["task"],
            "model_type": document["model_type"],
            "layers": layers,
            "parity": parity,
            "files": {item.name: item.stat().st_size for item in sorted(out.iterdir()) if item.is_file()},
            "export_warnings": [warning[:200] for warning in warnings][:20],
            "library_warnings": messages,
            "seconds": seconds,
        }
        attrs = {"task": document["task"], "hf_source": str(source)}
        if copied and any(name.startswith("tokenizer") for name in copied):
            attrs["tokenizer"] = str(out)
        return PassResult(model=ModelArtifact.from_folder("seq2seq", out, attrs=attrs), details=details, notes=notes)


def _config(transformers: Any, source: Path) -> Any:
    if not (source / "config.json").is_file():
        raise ValueError(f"{source} is not a Hugging Face folder: it has no config.json")
    config = transformers.AutoConfig.from_pretrained(str(source), local_files_only=True)
    if not getattr(config, "is_encoder_decoder", False):
        raise ValueError(
            f"{source / 'config.json'}: model_type {config.model_type!r} is not an encoder-decoder model (is_encoder_decoder is not true); "
            "seq2seq_export takes Whisper, T5, BART, Marian and their kin; export a decoder-only model with decoder_export or genai_build"
        )
    return config


def _is_audio(config: Any, task: str, source: Path) -> bool:
    audio = config.model_type in AUDIO_TYPES or hasattr(config, "num_mel_bins")
    if task == "auto":
        return audio
    wanted = task == "automatic-speech-recognition"
    if wanted != audio:
        kind = "an audio model (input_features)" if audio else "a text model (input_ids)"
        right = TASKS[1] if audio else TASKS[0]
        raise ValueError(
            f"task {task!r} does not fit {source / 'config.json'}: model_type {config.model_type!r} is {kind}; use task {right!r}"
        )
    return audio


def _start_token(config: Any, source: Path) -> int:
    generation = source / "generation_config.json"
    start = None
    if generation.is_file():
        start = json.loads(generation.read_text()).get("decoder_start_token_id")
    start = start if start is not None else getattr(config, "decoder_start_token_id", None)
    if isinstance(start, list):
        start = start[0] if start else None
    if start is None:
        raise ValueError(
            f"{source / 'config.json'} has no decoder_start_token_id: the decoder's first token is unknown; add it to config.json"
        )
    return int(start)


def _parity(lm: Any, audio: bool, folder: Path, tokens: int, tolerance: float) -> dict[str, Any]:
    """onnxruntime (the exported parts, Kiln's greedy loop) against PyTorch's forward on a synthetic source."""
    import numpy as np
    import onnxruntime

    from passes.generate._seq2seq import example_source, torch_greedy
    from targets.onnxruntime.seq2seq import open_seq2seq

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = open_seq2seq(lambda path: onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]), folder, {})
    source = example_source(lm.config, 1, 11, audio, seed=2)
    prompt = session.start_tokens()
    expected_tokens, expected_logits = torch_greedy(lm, source, prompt, tokens)
    feeds = {name: tensor.numpy() for name, tensor in source.items()}
    got_logits = session.first_logits(feeds, prompt)
    got_tokens = session.generate_from(feeds, tokens, prompt).tokens
    session.close()
    diff = float(np.abs(got_logits.astype(np.float64) - expected_logits.astype(np.float64)).max())
    if diff > tolerance:
        raise ValueError(
            f"onnxruntime and torch differ by up to {diff:.3g} on the first step's logits, above parity_tolerance {tolerance:g}"
        )
    if got_tokens != expected_tokens:
        raise ValueError(f"onnxruntime's greedy tokens {got_tokens} differ from PyTorch's {expected_tokens}")
    return {"max_abs_diff": diff, "tolerance": tolerance, "greedy_tokens": len(got_tokens), "greedy_match": True}
