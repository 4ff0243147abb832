"""``gptq``: GPTQ weight quantization of a decoder in PyTorch before the ONNX build (Frantar et
al., 2022, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers",
Algorithm 1: see ``passes.torch_quant._gptq``), layer by layer on the CPU in float32 (see
``passes.torch_quant._layerwise``, whose docstring gives the memory it needs: about 38 GB of RAM
for a 7B model with 128 samples of 2048 tokens).

Calibration text comes from a workflow dataset (``calibration``) tokenized with the model's
tokenizer (a text source such as ``text_lines`` with ``tokenizer:``): the tokens of its rows
(where ``attention_mask`` is 1) are joined into one stream and cut into ``samples`` windows of
``sequence_length`` tokens (fewer when the text is short; one shorter window at least).

Options are Olive's ``gptq`` pass's: bits, group_size, sym, lm_head, overrides,
modules_to_not_convert, damp_percent, desc_act (act order: with groups, "static groups", so the
checkpoint needs no g_idx); block_size is the lazy-batch width of Algorithm 1. The output is the
``olive`` checkpoint that ``genai_build`` (``precision: int4``) turns into MatMulNBits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from engine.core import Categorical, DatasetRef, PassContext
from passes.torch_quant._pass import TorchQuantConfig, TorchQuantPass

if TYPE_CHECKING:
    import torch


def calibration_windows(ids: Any, mask: Any, samples: int, sequence_length: int) -> list[torch.Tensor]:
    """``samples`` windows ``(1, sequence_length)`` of the tokens of rows ``ids`` (where ``mask`` is 1), joined."""
    import numpy as np
    import torch

    stream = np.concatenate([np.asarray(row)[np.asarray(keep) == 1] for row, keep in zip(ids, mask, strict=True)]).astype(np.int64)
    if stream.size < 2:
        raise ValueError("the calibration dataset has fewer than 2 tokens")
    count = max(1, min(samples, stream.size // sequence_length))
    length = min(sequence_length, stream.size)
    return [torch.from_numpy(stream[i * length : (i + 1) * length].copy()).unsqueeze(0) for i in range(count)]


def token_windows(ctx: PassContext, dataset: str, samples: int, sequence_length: int, vocab: int, who: str) -> list[torch.Tensor]:
    """``calibration_windows`` of the workflow dataset ``dataset`` (``input_ids``, ``attention_mask``
    rows), checked against the model's ``vocab``; ``who`` names the pass in errors."""
    import numpy as np

    data = ctx.dataset(dataset)
    if "input_ids" not in data.inputs:
        raise ValueError(
            f"{who} reads token ids from the calibration dataset's input_ids; dataset '{dataset}' has "
            f"{', '.join(sorted(data.inputs)) or 'nothing'}: use a text source with the model's tokenizer"
        )
    ids = np.asarray(data.inputs["input_ids"])
    mask = np.asarray(data.inputs["attention_mask"]) if "attention_mask" in data.inputs else np.ones_like(ids)
    windows = calibration_windows(ids, mask, samples, sequence_length)
    if max(int(w.max()) for w in windows) >= vocab:
        raise ValueError(f"a calibration token id lies outside the model's vocabulary of {vocab}: tokenized with another tokenizer?")
    return windows


class Gptq(TorchQuantPass):
    name = "gptq"
    summary = (
        "GPTQ weight quantization of a Hugging Face decoder in PyTorch (layer by layer, Hessians from a calibration dataset, "
        "4 or 8 bits per group), written as an olive-format checkpoint that genai_build turns into MatMulNBits."
    )
    version = "2"  # 2: a tied head is untied before it is quantized (the embedding stays float)
    method = "gptq"
    search_space = {"group_size": Categorical((32, 128)), "damp_percent": Categorical((0.01, 0.1))}

    class Config(TorchQuantConfig):
        calibration: DatasetRef = Field(
            description="The dataset of calibration text, tokenized with the model's tokenizer (input_ids, attention_mask)."
        )
        samples: int = Field(128, ge=1, le=4096, description="Calibration windows (the paper: 128 segments of 2048 tokens).")
        sequence_length: int = Field(512, ge=2, le=32768, description="Tokens per calibration window.")
        damp_percent: float = Field(
            0.01, gt=0.0, le=1.0, description="Dampening added to the Hessian's diagonal, as a fraction of its mean."
        )
        desc_act: bool | None = Field(
            None,
            description="Act order: quantize columns by decreasing Hessian diagonal. null = true for group_size -1, else false "
            "(Olive's default); with groups, each group's grid comes from the original weights (static groups, no g_idx).",
        )
        block_size: int = Field(128, ge=1, le=4096, description="Columns per lazy batch update (Algorithm 1's B).")

    config: Config

    def calibration(self, model: torch.nn.Module, tokenizer: Any, ctx: PassContext) -> tuple[dict[str, Any], dict[str, Any]]:
        return gptq_options(self.config, model, ctx, "gptq")


def gptq_options(cfg: Any, model: torch.nn.Module, ctx: PassContext, who: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``quantize_linear_layers``' gptq options from a config with gptq's calibration fields (this
    pass's, or quarot's with method gptq), and what the pass details say of them."""
    vocab = model.get_input_embeddings().num_embeddings
    windows = token_windows(ctx, cfg.calibration, cfg.samples, cfg.sequence_length, vocab, who)
    desc_act = cfg.desc_act if cfg.desc_act is not None else cfg.group_size == -1
    extra = {"calibration_batches": windows, "damp_percent": cfg.damp_percent, "desc_act": desc_act, "block_size": cfg.block_size}
    details = {"calibration": {"windows": len(windows), "tokens": sum(int(w.numel()) for w in windows)}, "desc_act": desc_act}
    return extra, details
