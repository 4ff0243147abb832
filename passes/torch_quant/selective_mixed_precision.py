"""``selective_mixed_precision``: chooses which linear modules of a Hugging Face decoder a following
``gptq``, ``rtn`` or ``quarot`` step quantizes at ``high_bits`` (8) while the rest get ``bits`` (4):
Olive's ``SelectiveMixedPrecision`` pass, with its option names.

Like Olive's pass it quantizes nothing. The output is the input's folder with the same float
weights, its config.json gaining Olive's ``mixed_precision_info``::

    {"default": {"bits": 4, ...}, "overrides": {"lm_head": {"bits": 8}, "model.layers.0.mlp.down_proj": {"bits": 8}, ...}}

which the quantizing step merges into its own ``overrides`` (``passes.torch_quant._pass``), so
``genai_build`` (``precision: int4``) writes MatMulNBits with ``bits=8`` on the chosen modules.
The choice is part of the folder's bytes, hence of the next job's key.

Algorithms (Olive's; presets and promotion shared with the ONNX-level ``mixed_precision`` through
``passes.quantize.precision_select``, scores in ``passes.torch_quant._sensitivity``):

- ``k_quant_last``: ``lm_head``; ``k_quant_down``: also the MLP down projections, and
  ``k_quant_mixed``: also q/k/v, of the first and last eighth of the layers and every third layer
  between. The overrides hold ``bits`` only (the quantizing step's group size and symmetry apply).
- ``snr`` (no data) and ``kld_gradient`` (``calibration`` text): units ranked by sensitivity to
  ``bits``/``group_size``/``sym`` quantization, the most sensitive moved to ``high_bits`` until
  they hold at least ``1 - ratio`` of the candidates' weights. The overrides hold ``bits``,
  ``group_size`` and ``symmetric`` (``high_group_size``/``high_sym``, default the low ones).

The q/k/v projections of one attention always share a precision (the build fuses them). With tied
embeddings a chosen ``lm_head`` names the embedding too, as Olive does. Input: an ``hf`` folder or
a ``torch`` factory (an input already quantized is refused: the choice is for the quantizing step
that follows); ``kld_gradient`` runs the model forward and backward on the CPU in float32.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from engine.core import Categorical, DatasetRef, ModelArtifact, Pass, PassConfig, PassContext, PassResult
from passes.generate._common import hf_input
from passes.torch_quant._input import refuse_quantized
from passes.torch_quant._pass import MIXED_PRECISION_KEY, Bits, GroupSize, load_decoder

if TYPE_CHECKING:
    import torch

Algorithm = Literal["k_quant_mixed", "k_quant_last", "k_quant_down", "snr", "kld_gradient"]
SCORED = ("snr", "kld_gradient")
CHOOSES_BEFORE = "it chooses the precisions of a following rtn, gptq or quarot step; run it first, on the float model (as Olive does)"


class SelectiveMixedPrecision(Pass):
    name = "selective_mixed_precision"
    summary = (
        "Chooses the linear modules of a Hugging Face decoder that a following gptq/rtn/quarot step quantizes at 8 bits "
        "(Olive's k_quant presets, weight SNR or KL-divergence gradients) and writes the choice into its config.json."
    )
    version = "1"
    accepts = ("hf", "torch")
    produces = "hf"
    libraries = ("torch", "transformers", "safetensors")
    search_space = {"algorithm": Categorical(("k_quant_last", "k_quant_down", "k_quant_mixed"))}

    class Config(PassConfig):
        algorithm: Algorithm = Field(
            "k_quant_mixed",
            description="How the high-precision modules are chosen: Olive's k_quant_* presets by layer, or ranked by "
            "snr (weights alone) / kld_gradient (KL divergence gradients on calibration text).",
        )
        bits: Bits = Field(4, description="The default precision of the following quantization.")
        high_bits: Bits = Field(8, description="The precision of the chosen modules.")
        group_size: GroupSize = Field(128, description="snr / kld_gradient: the group size of the low-precision quantization scored.")
        sym: bool = Field(False, description="snr / kld_gradient: symmetric low-precision quantization is scored.")
        high_group_size: GroupSize | None = Field(
            None, description="snr / kld_gradient: the chosen modules' group size (null: group_size)."
        )
        high_sym: bool | None = Field(None, description="snr / kld_gradient: the chosen modules' symmetry (null: sym).")
        ratio: float | None = Field(
            None, gt=0, lt=1, description="snr / kld_gradient: the share of the candidates' weights (by count) left at bits."
        )
        calibration: DatasetRef | None = Field(
            None,
            description="kld_gradient: the dataset of calibration text, tokenized with the model's tokenizer (input_ids, attention_mask).",
        )
        samples: int = Field(128, ge=1, le=4096, description="kld_gradient: calibration windows.")
        sequence_length: int = Field(512, ge=2, le=32768, description="kld_gradient: tokens per calibration window.")

        @model_validator(mode="after")
        def _check(self) -> SelectiveMixedPrecision.Config:
            if self.high_bits <= self.bits:
                raise ValueError(f"high_bits ({self.high_bits}) must be above bits ({self.bits})")
            if self.algorithm in SCORED and self.ratio is None:
                raise ValueError(f"algorithm {self.algorithm} needs ratio: the share of the weights kept at bits (0 < ratio < 1)")
            if (self.algorithm == "kld_gradient") != (self.calibration is not None):
                raise ValueError("calibration is needed by, and used by, algorithm kld_gradient only")
            return self

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        from passes.torch_quant import _sensitivity as sens

        cfg = self.config
        source, notes = hf_input(model, ctx, self.name)
        refuse_quantized(source, self.name, CHOOSES_BEFORE)
        started = time.perf_counter()
        decoder = _meta_decoder(source) if cfg.algorithm.startswith("k_quant") else load_decoder(source, self.name)[0]
        modules = sens.candidates(decoder)
        units = sens.selection_units(modules)
        if cfg.algorithm.startswith("k_quant"):
            default, overrides, scores = self._preset(units)
        else:
            default, overrides, scores = self._scored(decoder, modules, units, ctx)
        if overrides.get("lm_head") and getattr(decoder.config, "tie_word_embeddings", False):
            embeddings = {id(m): n for n, m in decoder.named_modules()}.get(id(decoder.get_input_embeddings()))
            if embeddings:
                overrides[embeddings] = dict(overrides["lm_head"])
        if cfg.algorithm.startswith("k_quant") and cfg.ratio is not None:
            notes.append(f"ratio is used by snr and kld_gradient; {cfg.algorithm} chooses by layer")
        _write(source, Path(ctx.output_dir), {"default": default, "overrides": dict(sorted(overrides.items()))})
        sizes = {name: int(module.weight.numel()) for name, module in modules.items()}
        high = sum(size for name, size in sizes.items() if name in overrides)
        details: dict[str, Any] = {
            "algorithm": cfg.algorithm,
            "high_bits": cfg.high_bits,
            "chosen": sorted(overrides),
            "candidates": len(modules),
            "low_bit_share": round(1 - high / max(sum(sizes.values()), 1), 4),
            "scores": {unit: round(score, 6) for unit, score in sorted(scores.items())},
            "seconds": round(time.perf_counter() - started, 3),
        }
        return PassResult(model=ModelArtifact.from_folder("hf", ctx.output_dir), details=details, notes=notes)

    def _preset(self, units: dict[str, list[Any]]) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, float]]:
        from passes.quantize import precision_select as select

        weights = [w for members in units.values() for w in members]
        chosen = select.k_quant_preset(weights, self.config.algorithm)
        return {"bits": self.config.bits}, {name: {"bits": self.config.high_bits} for name in chosen}, {}

    def _scored(
        self, decoder: torch.nn.Module, modules: dict[str, Any], units: dict[str, list[Any]], ctx: PassContext
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, float]]:
        from passes.quantize import precision_select as select
        from passes.torch_quant import _sensitivity as sens
        from passes.torch_quant._grid import QuantSpec
        from passes.torch_quant.gptq import token_windows

        cfg = self.config
        high_group = cfg.high_group_size if cfg.high_group_size is not None else cfg.group_size
        high_sym = cfg.high_sym if cfg.high_sym is not None else cfg.sym
        low, high = QuantSpec(cfg.bits, cfg.group_size, cfg.sym), QuantSpec(cfg.high_bits, high_group, high_sym)
        for name, module in modules.items():
            for spec in (low, high):
                try:
                    spec.groups(module.in_features)
                except ValueError as error:
                    raise ValueError(f"{name}: {error}") from None
        if cfg.algorithm == "snr":
            scores = sens.snr_scores(modules, units, low)
        else:
            assert cfg.calibration is not None  # the config refuses kld_gradient without it
            vocab = decoder.get_input_embeddings().num_embeddings
            windows = token_windows(ctx, cfg.calibration, cfg.samples, cfg.sequence_length, vocab, self.name)
            scores = sens.kld_scores(sens.kld_alignments(decoder, list(modules), low, high, windows), units)
        sizes = {key: sum(w.size for w in members) for key, members in units.items()}
        chosen = select.promote(scores, sizes, float(cfg.ratio or 0.5))
        override = {"bits": cfg.high_bits, "group_size": high_group, "symmetric": high_sym}
        overrides = {w.node: dict(override) for key in chosen for w in units[key]}
        return {"bits": cfg.bits, "group_size": cfg.group_size, "symmetric": cfg.sym}, overrides, scores


def _meta_decoder(folder: Path) -> torch.nn.Module:
    """The folder's causal LM without its weights (module names and shapes only)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _write(source: Path, out: Path, info: dict[str, Any]) -> None:
    """``source``'s files copied into ``out``, its config.json with ``info`` as ``mixed_precision_info``."""
    config = json.loads((source / "config.json").read_text())
    shutil.copytree(source, out, dirs_exist_ok=True, ignore=lambda folder, names: ["config.json"] if Path(folder) == source else [])
    config[MIXED_PRECISION_KEY] = info
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
