"""QuaRot (Ashkboos et al. 2024, "QuaRot: Outlier-Free 4-Bit Inference in Rotated LLMs"): rotate a
Hugging Face decoder so that its weights lose their outlier channels, then quantize its linear
layers (round to nearest or GPTQ) and write the quantized checkpoint ONNX Runtime GenAI's model
builder reads (``genai_build`` turns it into MatMulNBits with these very codes).

The rotation is the part of QuaRot that folds into the weights (``passes.torch_quant._rotate``):
RMSNorm scales fused into the next linears, a random Hadamard rotation of the residual stream
(R1) and, with ``rotate_heads``, of each attention head's values (R2). The online Hadamards
QuaRot puts before down_proj and on the key/value cache need kernels a checkpoint cannot carry
and are not applied, so activations stay float: this is the weight-only use of QuaRot, which
Olive's ``QuaRot`` pass followed by its ``gptq`` or ``rtn`` pass makes too (``method: none`` is
Olive's ``QuaRot`` alone: the rotated float checkpoint, for a following ``rtn`` or ``gptq`` step). The option names are
Olive's (``seed``, ``rotate_mode`` of QuaRot; ``bits``, ``group_size``, ``sym``, ``lm_head``,
``modules_to_not_convert``, ``overrides`` of rtn and gptq, shared with Kiln's ``rtn``;
``calibration``, ``samples``, ``sequence_length``, ``damp_percent``, ``desc_act``, ``block_size``
as Kiln's ``gptq`` takes them), with ``method`` choosing the quantizer.

Input: an ``hf`` folder, or a ``torch`` factory returning ``(PreTrainedModel, tokenizer)``
(saved as a Hugging Face folder first, see ``passes.generate._common``). Llama, Mistral, Qwen2,
Qwen3 and Phi-3 layouts; other architectures are refused by name. An input annotated by
``selective_mixed_precision`` has its per-module overrides merged into the step's own (the
step's win; ``method: none`` carries the annotation on in config.json). An input already
quantized (an olive checkpoint, or any other ``quantization_config``) is refused: a rotation
would not keep its codes. The model is loaded in
float32; the rotation is computed in float64.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from engine.core import Categorical, DatasetRef, ModelArtifact, Pass, PassContext, PassResult
from passes.generate._common import hf_input
from passes.torch_quant._input import refuse_quantized
from passes.torch_quant._pass import TorchQuantConfig, inherit_mixed_precision, load_decoder

if TYPE_CHECKING:
    import torch

ROTATING_QUANTIZED = (
    "rotating quantized weights would not keep their codes; run quarot on the float model, before gptq or rtn "
    "(its method option quantizes after the rotation)"
)


class QuaRot(Pass):
    name = "quarot"
    summary = (
        "QuaRot: rotate a Hugging Face decoder's weights with random Hadamard matrices (outliers spread out, same function), "
        "then quantize its linear layers (rtn or gptq) into an olive checkpoint genai_build turns into MatMulNBits."
    )
    version = "1"
    accepts = ("hf", "torch")
    produces = "hf"
    libraries = ("torch", "transformers", "safetensors")
    search_space = {"group_size": Categorical((32, 64, 128)), "rotate_heads": Categorical((True, False))}
    default_timeout_s = 7200.0

    class Config(TorchQuantConfig):
        seed: int = Field(0, description="Seed of the random rotations (Olive's QuaRot seed).")
        rotate_mode: Literal["hadamard", "random"] = Field(
            "hadamard",
            description="hadamard: randomised Hadamard matrices (QuaRot; a random orthogonal matrix where the size is not a power "
            "of two); random: random orthogonal matrices (QR of a Gaussian).",
        )
        rotate_heads: bool = Field(
            True, description="Also rotate each attention head's values (v_proj outputs, o_proj inputs): QuaRot's R2."
        )
        method: Literal["rtn", "gptq", "none"] = Field(
            "rtn",
            description="The quantizer after the rotation: round to nearest or GPTQ; none writes the rotated float checkpoint "
            "(Olive's QuaRot alone, for a following rtn or gptq step).",
        )
        calibration: DatasetRef | None = Field(
            None,
            description="gptq: the dataset of calibration text, tokenized with the model's tokenizer (input_ids, attention_mask).",
        )
        samples: int = Field(128, ge=1, le=4096, description="gptq: calibration windows.")
        sequence_length: int = Field(512, ge=2, le=32768, description="gptq: tokens per calibration window.")
        damp_percent: float = Field(0.01, gt=0.0, le=1.0, description="gptq: dampening, a fraction of the Hessian's mean diagonal.")
        desc_act: bool | None = Field(
            None, description="gptq: act order (columns by decreasing Hessian diagonal). null = true for group_size -1, else false."
        )
        block_size: int = Field(128, ge=1, le=4096, description="gptq: columns per lazy batch update.")

        @model_validator(mode="after")
        def _gptq_needs_calibration(self) -> QuaRot.Config:
            if self.method == "gptq" and self.calibration is None:
                raise ValueError("method gptq needs calibration: a dataset of token rows (input_ids, attention_mask)")
            return self

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        import torch

        from passes.torch_quant._quantize import quantize_linear_layers, write_checkpoint
        from passes.torch_quant._rotate import check_architecture, rotate_model

        cfg = self.config
        source, notes = hf_input(model, ctx, self.name)
        refuse_quantized(source, self.name, ROTATING_QUANTIZED)
        decoder, tokenizer = load_decoder(source, self.name)
        check_architecture(decoder.config)
        started = time.perf_counter()
        report = rotate_model(decoder, seed=cfg.seed, rotate_mode=cfg.rotate_mode, rotate_heads=cfg.rotate_heads)
        record = {"rotation": {"method": "quarot", "seed": cfg.seed, "rotate_mode": cfg.rotate_mode, **report.to_json()}}
        out = Path(ctx.output_dir)
        if cfg.method == "none":
            decoder.save_pretrained(out)
            if tokenizer is not None:
                tokenizer.save_pretrained(out)
            details = {"method": "none", **record, "seconds": round(time.perf_counter() - started, 3)}
            return PassResult(model=ModelArtifact.from_folder("hf", out), details=details, notes=[*notes, *report.notes])
        extra, details = self._gptq_options(decoder, ctx) if cfg.method == "gptq" else ({}, {})
        options = cfg.quantizer_options()
        notes = [*notes, *inherit_mixed_precision(options, source)]
        torch.manual_seed(0)
        quantized = quantize_linear_layers(decoder, cfg.method, **options, **extra)  # type: ignore[arg-type]
        seconds = round(time.perf_counter() - started, 3)
        facts = write_checkpoint(
            decoder,
            tokenizer,
            out,
            quantized,
            bits=cfg.bits,
            group_size=cfg.group_size,
            sym=cfg.sym,
            lm_head=cfg.lm_head,
            extra_config=record,
        )
        ctx.logger.debug("quarot %s: rotated and quantized %d modules in %.1f s", ctx.step_id, len(quantized), seconds)
        return PassResult(
            model=ModelArtifact.from_folder("hf", out),
            details={"method": cfg.method, **record, **facts, **details, "seconds": seconds},
            notes=[*notes, *report.notes],
        )

    def _gptq_options(self, decoder: torch.nn.Module, ctx: PassContext) -> tuple[dict[str, Any], dict[str, Any]]:
        """``quantize_linear_layers``' gptq options, from the calibration dataset as the gptq pass reads it."""
        from passes.torch_quant.gptq import gptq_options

        assert self.config.calibration is not None  # the config refuses gptq without it
        return gptq_options(self.config, decoder, ctx, "quarot's gptq")
