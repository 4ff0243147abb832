"""A ``genai`` decoder made static for NPUs that need fixed shapes: Olive's ``StaticLLM`` (its
QNN-GPU form, one decoder model in, a prefill and a token-generation model out).

The input is a decoder built by ``genai_build`` (GroupQueryAttention, past and present sharing one
``[batch, kv_heads, max_length, head_size]`` buffer). Every symbolic dim becomes fixed with
onnxruntime's own tool (``onnxruntime.tools.onnx_model_utils.make_dim_param_fixed``):

- batch -> ``batch_size``; head size -> genai_config's ``head_size``;
- the cache (past and present sequence, the attention mask's length) -> ``cache_length``
  (null: the model's context length): the buffer the attention kernel writes in place, the mask
  saying how much of it is valid;
- the new tokens per run -> ``context_length`` in ``model.onnx`` (the prefill) and 1 in
  ``decode.onnx`` (token generation), written when ``prefill_decode_models`` is true (Olive's
  default). Both models read one ``model.onnx.data``.

A prompt is run right-padded to ``context_length`` with an attention mask of ``context_length``
ones: the padded positions come after the prompt, so causal attention keeps them out of the
prompt's logits, and the first generated token overwrites the cache from the prompt's end on
(``targets.onnxruntime.static_decoder`` is Kiln's loop over such a folder). A prompt longer than
``context_length`` is refused there.

genai_config.json's ``context_length`` and ``search.max_length`` become ``cache_length``; with
``update_genai_config`` the decoder gets Olive's ``pipeline`` (``run_on_prompt`` /
``run_on_token_gen`` per model, ``group_session_options`` as each model's session options) and a
``sliding_window`` of ``context_length``, type ``decoder-pipeline``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from pydantic import Field, PositiveInt

from engine.core import ModelArtifact, PassConfig, PassContext, PassResult
from passes.common.onnx_io import MODEL_FILE, clamp_ir_version
from passes.common.pass_io import GENAI_CONFIG, copy_genai_sidecars, require
from passes.generate._common import GenaiPass

DECODE_FILE = "decode.onnx"
DATA_FILE = "model.onnx.data"


class StaticLlm(GenaiPass):
    name = "static_llm"
    summary = (
        "Make a genai decoder static for NPUs (Olive's StaticLLM): fixed batch, prompt length and KV-cache length, "
        "a prefill model and a one-token generation model sharing their weights."
    )
    version = "1"
    accepts = ("genai",)
    produces = "genai"
    libraries = ("onnx", "onnxruntime")

    class Config(PassConfig):
        batch_size: PositiveInt = Field(1, description="Fixed batch size of the models (Kiln's loop runs batch 1).")
        context_length: PositiveInt = Field(
            64, description="Fixed number of tokens the prefill model takes (a prompt is right-padded to it; longer ones are refused)."
        )
        cache_length: PositiveInt | None = Field(
            None, description="Fixed KV-cache length (prompt plus generated tokens). null = the model's context length."
        )
        prefill_decode_models: bool = Field(
            True,
            description="Write a prefill model (context_length tokens, model.onnx) and a token-generation model (1 token, "
            "decode.onnx); false writes the prefill model only, which then runs every step padded.",
        )
        group_session_options: dict[str, Any] | None = Field(
            None, description="Session options of the static models, written into genai_config's pipeline (with update_genai_config)."
        )
        update_genai_config: bool = Field(
            False, description="Write Olive's decoder pipeline (run_on_prompt / run_on_token_gen, sliding_window) into genai_config.json."
        )

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        import onnx

        (utils,) = require("onnxruntime", self.name, "onnxruntime.tools.onnx_model_utils")
        cfg = self.config
        genai = json.loads((Path(model.path) / GENAI_CONFIG).read_text())
        decoder = genai["model"]["decoder"]
        proto = onnx.load(str(model.model_file))
        dims, cache_length = _dim_names(proto, genai, cfg)
        out = Path(ctx.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        clamp_ir_version(proto)
        # the weights are written once; both models then point into model.onnx.data
        onnx.save_model(proto, str(out / MODEL_FILE), save_as_external_data=True, all_tensors_to_one_file=True, location=DATA_FILE)
        lengths = {MODEL_FILE: cfg.context_length, DECODE_FILE: 1} if cfg.prefill_decode_models else {MODEL_FILE: cfg.context_length}
        shapes: dict[str, Any] = {}
        for file, length in lengths.items():
            fixed = copy.deepcopy(proto)
            values = {dims["batch"]: cfg.batch_size, dims["sequence"]: length, dims["past"]: cache_length, dims["total"]: cache_length}
            if "head" in dims:
                values[dims["head"]] = int(decoder["head_size"])
            for name, value in values.items():
                utils.make_dim_param_fixed(fixed.graph, name, value)
            left = [
                f"{item.name}: {_shape(item)}" for item in (*fixed.graph.input, *fixed.graph.output) if not utils.is_fixed_size_tensor(item)
            ]
            if left:
                raise ValueError(f"dims stay symbolic in {file}: {'; '.join(left)}")
            onnx.save_model(fixed, str(out / file))
            shapes[file] = {item.name: _shape(item) for item in fixed.graph.input if item.name in ("input_ids", "attention_mask")}
        copy_genai_sidecars(model, out)
        (out / GENAI_CONFIG).write_text(json.dumps(_genai_config(genai, cfg, cache_length, proto, lengths), indent=4) + "\n")
        details = {"batch_size": cfg.batch_size, "context_length": cfg.context_length, "cache_length": cache_length, "models": shapes}
        return PassResult(model=ModelArtifact.from_folder("genai", out, attrs=model.attrs), details=details)


def _shape(item: Any) -> list[int | str]:
    return [dim.dim_value if dim.HasField("dim_value") else dim.dim_param for dim in item.type.tensor_type.shape.dim]


def _dim_names(proto: Any, genai: dict[str, Any], cfg: StaticLlm.Config) -> tuple[dict[str, str], int]:
    """The symbolic dims to fix (batch, sequence, past, total, head) and the cache length, after
    checking the decoder is one this pass makes static."""
    decoder = genai["model"]["decoder"]
    names = decoder.get("inputs", {})
    if not any(node.op_type == "GroupQueryAttention" for node in proto.graph.node):
        raise ValueError("static_llm needs a GroupQueryAttention decoder (one built by genai_build)")
    if not genai.get("search", {}).get("past_present_share_buffer", False):
        raise ValueError("static_llm needs a decoder whose past and present share one buffer (search.past_present_share_buffer)")
    inputs = {item.name: _shape(item) for item in proto.graph.input}
    ids = inputs.get(names.get("input_ids", "input_ids"))
    mask = inputs.get(names.get("attention_mask", "attention_mask"))
    past = inputs.get(names.get("past_key_names", "past_key_values.%d.key") % 0)
    if ids is None or mask is None or past is None:
        raise ValueError("static_llm needs a decoder with input_ids, attention_mask and past key/value inputs")
    if not all(isinstance(dim, str) for dim in (*ids, mask[1], past[2])):
        raise ValueError(f"the decoder is static already: input_ids {ids}, attention_mask {mask}, past {past}")
    dims = {"batch": str(ids[0]), "sequence": str(ids[1]), "past": str(past[2]), "total": str(mask[1])}
    if isinstance(past[3], str):
        dims["head"] = past[3]
    context = int(genai["model"].get("context_length") or genai["search"]["max_length"])
    cache_length = cfg.cache_length or context
    if cache_length > context:
        raise ValueError(f"cache_length {cache_length} is longer than the model's context ({context}, its rotary tables' length)")
    if cfg.context_length > cache_length:
        raise ValueError(f"context_length {cfg.context_length} is longer than the cache ({cache_length})")
    return dims, cache_length


def _genai_config(genai: dict[str, Any], cfg: StaticLlm.Config, cache_length: int, proto: Any, lengths: dict[str, int]) -> dict[str, Any]:
    """genai_config.json for the static folder: the cache length as the context, and with
    update_genai_config Olive's pipeline of the prefill and token-generation models."""
    genai = copy.deepcopy(genai)
    genai["model"]["context_length"] = cache_length
    genai.setdefault("search", {})["max_length"] = cache_length
    if not cfg.update_genai_config:
        return genai
    decoder = genai["model"]["decoder"]
    genai["model"]["type"] = "decoder-pipeline"
    decoder["sliding_window"] = {"window_size": cfg.context_length, "pad_value": 0, "alignment": "right", "slide_key_value_cache": False}
    io = {"inputs": [item.name for item in proto.graph.input], "outputs": [item.name for item in proto.graph.output]}
    pipeline: dict[str, Any] = {}
    for file, length in lengths.items():
        stage = "decode" if length == 1 and len(lengths) > 1 else ("prefill" if len(lengths) > 1 else "model")
        entry: dict[str, Any] = {"filename": file, **io}
        if stage == "decode":
            entry["run_on_prompt"] = False
        elif stage == "prefill":
            entry["run_on_token_gen"] = False
        if cfg.group_session_options:
            entry["session_options"] = dict(cfg.group_session_options)
        pipeline[stage] = entry
    decoder["pipeline"] = [pipeline]
    return genai
