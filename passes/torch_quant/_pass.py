"""What the PyTorch weight-quantization passes share: the options of Olive's quantizers (bits,
group_size, sym, lm_head, modules_to_not_convert, overrides), loading the decoder in float32
from a Hugging Face folder or a ``torch`` factory, and writing the quantized checkpoint.

The output is a Hugging Face folder (``hf``) in ONNX Runtime GenAI's ``olive`` checkpoint format
(``passes.torch_quant._checkpoint``): ``genai_build`` with ``precision: int4`` turns it into
MatMulNBits nodes holding these quantized weights (8-bit modules included: the builder reads each
module's bits from the checkpoint).

The input may itself be such a checkpoint (Olive's ``gptq`` then ``rtn`` for the head): the
modules it holds quantized are loaded as their dequantized codes, written back unchanged, and only
the float ones are quantized (``passes.torch_quant._input``); any other quantization method is
refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from engine.core import ModelArtifact, Pass, PassConfig, PassContext, PassResult, StrictConfig
from passes.generate._common import hf_input
from passes.torch_quant._input import load_input
from passes.torch_quant._quantize import quantize_linear_layers, write_checkpoint

if TYPE_CHECKING:
    import torch

Bits = Literal[4, 8]
GroupSize = Literal[-1, 16, 32, 64, 128, 256]


class Override(StrictConfig):
    """Bits, group size or symmetry of the modules a pattern names (unset: the pass's own)."""

    bits: Bits | None = Field(None, description="Bits of these modules' weights.")
    group_size: GroupSize | None = Field(None, description="Weights per group along the input axis (-1: one group per output row).")
    sym: bool | None = Field(None, description="Symmetric (no zero points) or not.")


class TorchQuantConfig(PassConfig):
    bits: Bits = Field(4, description="Bits per weight: 4 or 8 (unsigned codes, as Olive and MatMulNBits store them).")
    group_size: GroupSize = Field(
        128, description="Weights sharing a scale (and zero point), along the input axis; -1 = one group per output row."
    )
    sym: bool = Field(False, description="Symmetric quantization: scales only, zero point 2**(bits-1); false adds a zero point per group.")
    lm_head: bool = Field(False, description="Quantize the language-model head too (Olive's default: no).")
    modules_to_not_convert: list[str] = Field(
        default_factory=list,
        description="Modules left in float: names matched as substrings (Hugging Face's rule), or 're:<regex>' matched in full.",
    )
    overrides: dict[str, Override] = Field(
        default_factory=dict,
        description="Per-module bits / group_size / sym: a module name (exact) or 're:<regex>' (full match) -> its settings; the first "
        "matching pattern wins. Mixed precision, e.g. {'re:.*down_proj': {bits: 8}} or {lm_head: {bits: 8}} with lm_head: true.",
    )

    @field_validator("overrides")
    @classmethod
    def _regexes_compile(cls, overrides: dict[str, Override]) -> dict[str, Override]:
        import re

        for pattern in overrides:
            if pattern.startswith("re:"):
                try:
                    re.compile(pattern[3:])
                except re.error as error:
                    raise ValueError(f"pattern {pattern!r} is not a regular expression: {error}") from None
        return overrides

    def quantizer_options(self) -> dict[str, Any]:
        """The options ``quantize_linear_layers`` takes from this config."""
        return {
            "bits": self.bits,
            "group_size": self.group_size,
            "sym": self.sym,
            "lm_head": self.lm_head,
            "modules_to_not_convert": list(self.modules_to_not_convert),
            "overrides": {pattern: o.model_dump(exclude_none=True) for pattern, o in self.overrides.items()},
        }


MIXED_PRECISION_KEY = "mixed_precision_info"  # Olive's model attribute, kept in config.json


def mixed_precision_info(folder: Path) -> dict[str, Any]:
    """The ``mixed_precision_info`` of a Hugging Face folder's config.json (empty when it has none)."""
    info = json.loads((Path(folder) / "config.json").read_text()).get(MIXED_PRECISION_KEY) or {}
    if not isinstance(info, dict) or not isinstance(info.get("overrides", {}), dict):
        raise ValueError(f"{folder}/config.json: {MIXED_PRECISION_KEY} is not {{'default': ..., 'overrides': {{module: ...}}}}")
    return info


def merge_overrides(own: dict[str, dict[str, Any]], inherited: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The step's ``own`` overrides, then the ``inherited`` ones (from the input's
    ``mixed_precision_info``): the first matching pattern wins, so the step's own patterns come
    first, and a module named in both takes the inherited settings updated by the step's (Olive's
    merge). Olive's ``symmetric`` is read as ``sym``."""

    def normal(values: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in values.items() if k in ("bits", "group_size", "sym") and v is not None}
        if values.get("symmetric") is not None and "sym" not in out:
            out["sym"] = bool(values["symmetric"])
        return out

    merged = {pattern: {**normal(inherited.get(pattern, {})), **values} for pattern, values in own.items()}
    merged.update({name: normal(values) for name, values in inherited.items() if name not in own})
    return merged


def inherit_mixed_precision(options: dict[str, Any], folder: Path) -> list[str]:
    """Merge the input folder's ``mixed_precision_info`` overrides into ``options["overrides"]``
    (``quantizer_options()``); returns notes for the pass result."""
    info = mixed_precision_info(folder)
    if not info:
        return []
    inherited = info.get("overrides") or {}
    options["overrides"] = merge_overrides(options["overrides"], inherited)
    notes = [f"{len(inherited)} module override(s) from the input's {MIXED_PRECISION_KEY} merged (the step's own win)"]
    default = info.get("default") or {}
    mine = {"bits": options["bits"], "group_size": options["group_size"], "symmetric": options["sym"]}
    differ = {k: v for k, v in default.items() if k in mine and v != mine[k]}
    if differ:
        notes.append(f"the input's {MIXED_PRECISION_KEY} default {differ} differs from this step's; the step's {mine} are used")
    return notes


def keep_quantized(options: dict[str, Any], quantized: dict[str, Any]) -> list[str]:
    """Leave the modules of an olive input that are already ``quantized`` out of ``options``
    (``quantizer_options()``): they are written with their own codes. Returns notes."""
    import re

    if not quantized:
        return []
    options["modules_to_not_convert"] = [*options["modules_to_not_convert"], *(f"re:{re.escape(name)}" for name in sorted(quantized))]
    return [f"{len(quantized)} module(s) of the input already quantized (olive checkpoint): kept with their codes, not quantized again"]


def load_decoder(folder: Path, who: str = "this pass") -> tuple[torch.nn.Module, Any]:
    """The causal LM of a float Hugging Face folder in float32, eval mode, and its tokenizer (None
    when it has none). A quantized input, or one whose checkpoint lacks weights, is refused
    (``passes.torch_quant._input``); ``who`` names the pass in the error."""
    loaded = load_input(folder, who)
    return loaded.model, loaded.tokenizer


class TorchQuantPass(Pass):
    """Base of ``rtn`` and ``gptq``: load, quantize (``method``), write the olive checkpoint."""

    accepts = ("hf", "torch")
    produces = "hf"
    libraries = ("torch", "transformers", "safetensors")
    method: str = "rtn"
    config: TorchQuantConfig

    def calibration(self, model: torch.nn.Module, tokenizer: Any, ctx: PassContext) -> tuple[dict[str, Any], dict[str, Any]]:
        """Extra options of ``quantize_linear_layers`` and details about them (none for RTN)."""
        return {}, {}

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        import time

        import torch

        source, notes = hf_input(model, ctx, self.name)
        loaded = load_input(source, self.name, allow_quantized=True)
        decoder, tokenizer = loaded.model, loaded.tokenizer
        started = time.perf_counter()
        extra, details = self.calibration(decoder, tokenizer, ctx)
        options = self.config.quantizer_options()
        notes = [*notes, *inherit_mixed_precision(options, source)]
        notes += keep_quantized(options, loaded.quantized)
        torch.manual_seed(0)
        quantized = quantize_linear_layers(decoder, self.method, **options, **extra)  # type: ignore[arg-type]
        seconds = round(time.perf_counter() - started, 3)
        out = Path(ctx.output_dir)
        cfg = self.config
        defaults = loaded.checkpoint_defaults(cfg.bits, cfg.group_size, cfg.sym, cfg.lm_head)
        facts = write_checkpoint(decoder, tokenizer, out, {**loaded.quantized, **quantized}, **defaults)
        if loaded.quantized:
            details["kept_quantized_modules"] = len(loaded.quantized)
        bits: dict[str, int] = {}
        for item in quantized.values():
            bits[f"int{item.spec.bits}"] = bits.get(f"int{item.spec.bits}", 0) + 1
        ctx.logger.debug("%s %s: %d modules quantized in %.1f s", self.name, ctx.step_id, len(quantized), seconds)
        return PassResult(
            model=ModelArtifact.from_folder("hf", out),
            details={"method": self.method, **facts, "modules_by_bits": bits, **details, "seconds": seconds},
            notes=notes,
        )
