"""Export a Hugging Face causal LM with its key/value cache through torch.onnx (the TorchScript
exporter), the second route to a ``genai`` folder besides ``genai_build``.

The exported model takes ``input_ids [batch, seq]``, ``attention_mask [batch, total]``,
``position_ids [batch, seq]`` and ``past_key_values.N.key / .value [batch, kv_heads, past, head]``
and returns ``logits [batch, seq, vocab]`` and ``present.N.key / .value [batch, kv_heads, total,
head]``: present is past with the new tokens' keys and values appended, so the past and present
buffers are not shared (``past_present_share_buffer: false`` in genai_config.json). A wrapper
builds transformers' ``DynamicCache`` from the flat past tensors and flattens the cache the model
returns; attention is the eager implementation (an explicit mask, which traces).

The input is a Hugging Face folder (``hf``: config.json, weights, tokenizer) or a ``torch``
factory whose function returns ``(PreTrainedModel, tokenizer)``; both are saved with
``save_pretrained`` into the step's workdir first (see ``passes.generate._common``).

The folder holds model.onnx with its weights as external data (model.onnx.data),
genai_config.json in the schema of ONNX Runtime GenAI's model builder, and the tokenizer
(tokenizer.json, tokenizer_config.json). Parity: onnxruntime's logits against PyTorch's on a
prompt from an empty cache and on one cached step; the pass fails above ``parity_tolerance``.
Exported and checked on tiny Llama, Qwen2, Mistral, Phi-3 and GPT-2 models.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from engine.core import ModelArtifact, PassConfig, PassContext, PassResult
from engine.core.model_kind import kind_refusal, read_config
from passes.common.onnx_io import EXTERNAL_DATA_FILE, MODEL_FILE, clamp_ir_version, ort_limits
from passes.common.pass_io import GENAI_CONFIG, require
from passes.common.whole_model import check_whole
from passes.generate._common import GenaiPass, decoder_facts, has_tokenizer, hf_input

#: text whose tokens are the parity check's prompt
PARITY_TEXT = "Kiln exports this decoder with its cache."
PARITY_TOKENS = 12
#: genai_config.json model types for HF model types ONNX Runtime GenAI reads otherwise: its "gpt2"
#: type is its legacy GPT-2 model (one combined past tensor per layer); its generic decoder-only
#: model, which the llama type selects, reads the per-layer key / value names written here
GENAI_TYPES = {"gpt2": "llama"}
#: the model builder's search defaults (genai_config.json "search"), greedy
SEARCH_DEFAULTS: dict[str, Any] = {
    "diversity_penalty": 0.0,
    "do_sample": False,
    "early_stopping": True,
    "length_penalty": 1.0,
    "min_length": 0,
    "no_repeat_ngram_size": 0,
    "num_beams": 1,
    "num_return_sequences": 1,
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
}


class DecoderExport(GenaiPass):
    name = "decoder_export"
    summary = (
        "Export a Hugging Face causal LM with past/present key-value inputs and outputs through torch.onnx into a genai folder "
        "(model.onnx, genai_config.json, tokenizer), checked against PyTorch on a prompt and a cached step."
    )
    version = "1"
    model_kinds = ("decoder",)
    accepts = ("hf", "torch")
    produces = "genai"
    libraries = ("torch", "transformers", "onnx", "onnxruntime")

    class Config(PassConfig):
        opset: int = Field(17, ge=14, le=20, description="ONNX opset the TorchScript exporter writes (14 to 20).")
        check_parity: bool = Field(True, description="Compare onnxruntime's logits with PyTorch's; fail above parity_tolerance.")
        parity_tolerance: float = Field(
            1e-3, gt=0, description="Largest absolute logit difference allowed between onnxruntime and PyTorch."
        )

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        cfg = self.config
        onnx, transformers = require("onnx", self.name, "onnx", "transformers")
        import torch

        from passes.common.graph_tools import quiet_library
        from passes.generate import _decoder

        _check_opset(cfg.opset)
        workdir = Path(ctx.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        source, notes = hf_input(model, ctx, self.name)
        _refuse_other_kinds(self.name, self.model_kinds, source)
        remote_code = model.attrs.get("trust_remote_code") is True  # input.trust_remote_code: the folder's code builds it
        out = Path(ctx.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with quiet_library() as messages:
            transformers.utils.logging.disable_progress_bar()
            lm = transformers.AutoModelForCausalLM.from_pretrained(
                str(source), attn_implementation="eager", dtype=torch.float32, local_files_only=True, trust_remote_code=remote_code
            ).eval()
            tokenizer = _tokenizer(transformers, source, remote_code, notes)
            shape = _decoder.shape_of(lm.config)
            wrapper = _decoder.DecoderWithCache(lm, shape.layers).eval()
            scratch = workdir / "export"
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir(parents=True)
            export_warnings = _decoder.export(wrapper, shape, cfg.opset, scratch / MODEL_FILE)
            _save(onnx, scratch / MODEL_FILE, out / MODEL_FILE)
            _check_whole(onnx, out / MODEL_FILE, shape)
            shutil.rmtree(scratch)
            if tokenizer is not None:
                tokenizer.save_pretrained(str(out))
        (out / GENAI_CONFIG).write_text(json.dumps(genai_config(lm, shape), indent=4) + "\n")
        seconds = round(time.perf_counter() - started, 3)

        parity: dict[str, Any] | None = None
        if cfg.check_parity:
            prompt = _parity_prompt(tokenizer, shape.vocab)
            parity = _decoder.parity(wrapper, shape, out / MODEL_FILE, prompt, cfg.parity_tolerance)
        else:
            notes.append("parity with PyTorch not checked (check_parity: false)")
        facts = decoder_facts(out)
        details: dict[str, Any] = {
            "exporter": "torchscript",
            "opset": cfg.opset,
            "model_type": shape.model_type,
            "layers": shape.layers,
            "num_key_value_heads": shape.kv_heads,
            "head_size": shape.head_size,
            "parity": parity,
            **facts,
            "export_warnings": [warning[:200] for warning in export_warnings],
            "library_warnings": messages,
            "seconds": seconds,
        }
        ctx.logger.debug("decoder_export %s: %s, parity %s", ctx.step_id, shape.model_type, parity and parity["max_abs_diff"])
        attrs = {"inputs": facts["inputs"], "outputs": facts["outputs"], **({"tokenizer": str(out)} if tokenizer is not None else {})}
        return PassResult(model=ModelArtifact.from_folder("genai", out, attrs=attrs), details=details, notes=notes)


def _tokenizer(transformers: Any, source: Path, remote_code: bool, notes: list[str]) -> Any:
    """The folder's tokenizer, read only where it has one; None (the parity prompt's ids are then
    synthetic) where it has no tokenizer files."""
    if has_tokenizer(source):
        return transformers.AutoTokenizer.from_pretrained(str(source), local_files_only=True, trust_remote_code=remote_code)
    notes.append("the input has no tokenizer files: none written; the parity prompt's token ids are synthetic")
    return None


def _refuse_other_kinds(name: str, kinds: tuple[str, ...], source: Path) -> None:
    """An encoder-decoder loads as its decoder alone (WhisperForCausalLM: no encoder, no
    cross-attention), which would export without error: refused, with the pass that fits."""
    refusal = kind_refusal(name, kinds, read_config(source), str(source / "config.json"))
    if refusal is not None:
        raise ValueError(f"{refusal[0]}; {refusal[1]}")


def _check_opset(opset: int) -> None:
    _, max_opset = ort_limits()
    if opset > max_opset:
        raise ValueError(f"opset {opset} is above {max_opset}, the highest the installed onnxruntime loads")


def _check_whole(onnx: Any, path: Path, shape: Any) -> None:
    """The exported graph is the whole causal LM with its cache (position_ids aside: a model may not read them)."""
    from passes.generate import _decoder

    graph = onnx.load(str(path), load_external_data=False).graph
    input_names, output_names = _decoder.names(shape)
    needed = [name for name in input_names if name != "position_ids"]
    inputs, outputs = [v.name for v in graph.input], [v.name for v in graph.output]
    check_whole("a causal LM with its key/value cache", inputs, outputs, needed, output_names)


def genai_config(lm: Any, shape: Any) -> dict[str, Any]:
    """genai_config.json for the exported decoder, in the schema the model builder writes."""
    from passes.generate._decoder import PAST_KEY, PAST_VALUE, PRESENT_KEY, PRESENT_VALUE

    config, generation = lm.config, getattr(lm, "generation_config", None)

    def token(name: str) -> Any:
        value = getattr(generation, name, None) if generation is not None else None
        return value if value is not None else getattr(config, name, None)

    eos = token("eos_token_id")
    pad = token("pad_token_id")
    if pad is None:
        pad = eos[0] if isinstance(eos, list) else eos
    return {
        "model": {
            "bos_token_id": token("bos_token_id"),
            "context_length": shape.context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": MODEL_FILE,
                "head_size": shape.head_size,
                "hidden_size": shape.hidden,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "position_ids": "position_ids",
                    "past_key_names": PAST_KEY,
                    "past_value_names": PAST_VALUE,
                },
                "outputs": {"logits": "logits", "present_key_names": PRESENT_KEY, "present_value_names": PRESENT_VALUE},
                "num_attention_heads": shape.heads,
                "num_hidden_layers": shape.layers,
                "num_key_value_heads": shape.kv_heads,
            },
            "eos_token_id": eos,
            "pad_token_id": pad,
            "type": GENAI_TYPES.get(shape.model_type, shape.model_type),
            "vocab_size": shape.vocab,
        },
        "search": {**SEARCH_DEFAULTS, "max_length": shape.context, "past_present_share_buffer": False},
    }


def _parity_prompt(tokenizer: Any, vocab: int) -> list[int]:
    ids = [int(i) for i in tokenizer(PARITY_TEXT)["input_ids"]][:PARITY_TOKENS] if tokenizer is not None else []
    if len(ids) < 2 or max(ids) >= vocab:
        ids = [(7 * i + 3) % vocab for i in range(PARITY_TOKENS)]
    return ids


def _save(onnx: Any, exported: Path, target: Path) -> None:
    """The exported model, reproducible (no exporter-specific names or stamps) and loadable by the
    installed onnxruntime, with its weights in one external-data file."""
    from passes.export.exporters import make_reproducible

    proto = onnx.load(str(exported))
    make_reproducible(proto)
    clamp_ir_version(proto)
    onnx.save_model(
        proto, str(target), save_as_external_data=True, all_tensors_to_one_file=True, location=EXTERNAL_DATA_FILE, size_threshold=1024
    )
