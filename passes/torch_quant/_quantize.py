"""Weight-only quantization of a transformers decoder in PyTorch, shared by the ``rtn``, ``gptq``
(and rotation-based) passes. Two entry points, whose signatures stay stable:

``quantize_linear_layers(model, method, bits, group_size, sym, *, overrides, lm_head,
modules_to_not_convert, calibration_batches, damp_percent, desc_act, block_size) -> dict[str, QuantizedLinear]``
    quantizes in place every ``nn.Linear`` of the decoder layers (and ``lm_head`` when asked):
    each weight is replaced by its fake-quantized value (``(codes - zero) * scale``, float), so the
    model runs as the quantized checkpoint will; returns, by module name, the codes and grid the
    checkpoint writer needs. ``method`` is ``"rtn"`` (round to nearest, no data) or ``"gptq"``
    (``calibration_batches``: a list of ``input_ids`` tensors ``(batch, tokens)``; layer by layer,
    see ``passes.torch_quant._layerwise``). A pass that rotates or rescales the model first
    (QuaRot, SmoothQuant) calls it after its own transformation.

``write_checkpoint(model, tokenizer, out_dir, quantized, *, bits, group_size, sym, lm_head, extra_config=None) -> dict``
    writes the ``olive`` checkpoint folder (see ``passes.torch_quant._checkpoint``) that ONNX
    Runtime GenAI's model builder turns into MatMulNBits; returns facts for the pass's details.

Overrides (``{pattern: {"bits": .., "group_size": .., "sym": ..}}``) are Olive's: a pattern is a
module name matched literally, or ``re:<regex>`` matched with ``re.fullmatch``; the first
matching pattern wins. ``modules_to_not_convert`` lists names (substring match, as Hugging Face
does) or ``re:`` patterns of modules left in float.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from passes.torch_quant._checkpoint import write_checkpoint
from passes.torch_quant._grid import QuantSpec, dequantize, find_qparams, quantize
from passes.torch_quant._layerwise import decoder_layers, gptq_layerwise

if TYPE_CHECKING:
    import torch

__all__ = ["QuantSpec", "QuantizedLinear", "decoder_layers", "quantize_linear_layers", "select_linear_layers", "write_checkpoint"]

logger = logging.getLogger(__name__)


@dataclass
class QuantizedLinear:
    """One quantized ``nn.Linear``: uint8 codes ``(out, in)``, float32 scales and int32 zero
    points ``(out, groups)``, and the spec they were made with."""

    spec: QuantSpec
    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor

    def dequantized(self) -> torch.Tensor:
        return dequantize(self.codes, self.scales, self.zeros, self.spec)


def _matches(name: str, pattern: str, substring: bool) -> bool:
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], name) is not None
    return pattern in name if substring else pattern == name


def select_linear_layers(
    model: torch.nn.Module, *, lm_head: bool = False, modules_to_not_convert: list[str] | None = None
) -> dict[str, torch.nn.Linear]:
    """The ``nn.Linear`` modules quantization covers, by name: those of the decoder layers, plus
    ``lm_head`` when asked, minus ``modules_to_not_convert``."""
    import torch

    prefix, _ = decoder_layers(model)
    chosen = {}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        if not (name.startswith(prefix + ".") or (lm_head and name == "lm_head")):
            continue
        if any(_matches(name, pattern, substring=True) for pattern in modules_to_not_convert or ()):
            continue
        chosen[name] = module
    if lm_head and "lm_head" not in chosen and not any("lm_head" in p for p in modules_to_not_convert or ()):
        raise ValueError(f"lm_head: {type(model).__name__} has no nn.Linear named lm_head")
    return chosen


def spec_for(name: str, default: QuantSpec, overrides: dict[str, dict[str, Any]] | None) -> QuantSpec:
    """The spec of module ``name``: ``default`` updated by the first override whose pattern matches."""
    for pattern, values in (overrides or {}).items():
        if _matches(name, pattern, substring=False):
            return QuantSpec(
                bits=int(values.get("bits", default.bits)),
                group_size=int(values.get("group_size", default.group_size)),
                sym=bool(values.get("sym", values.get("symmetric", default.sym))),
            )
    return default


def rtn_quantize_weight(weight: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round to nearest: ``(codes, scales, zeros)`` of ``weight`` on its own groups' min/max grid."""
    scales, zeros = find_qparams(weight, spec)
    return quantize(weight, scales, zeros, spec), scales, zeros


def quantize_linear_layers(
    model: torch.nn.Module,
    method: Literal["rtn", "gptq"] = "rtn",
    bits: int = 4,
    group_size: int = 128,
    sym: bool = False,
    *,
    overrides: dict[str, dict[str, Any]] | None = None,
    lm_head: bool = False,
    modules_to_not_convert: list[str] | None = None,
    calibration_batches: list[torch.Tensor] | None = None,
    damp_percent: float = 0.01,
    desc_act: bool = False,
    block_size: int = 128,
) -> dict[str, QuantizedLinear]:
    """Quantize the model's linear layers in place (fake-quantized float weights); returns what
    ``write_checkpoint`` needs, by module name. See the module docstring."""
    import torch

    default = QuantSpec(bits=bits, group_size=group_size, sym=sym)
    modules = select_linear_layers(model, lm_head=lm_head, modules_to_not_convert=modules_to_not_convert)
    if "lm_head" in modules:
        _untie_head(model, modules["lm_head"])
    specs = {name: spec_for(name, default, overrides) for name in modules}
    for name, spec in specs.items():
        if spec.bits not in (4, 8):
            raise ValueError(f"{name}: bits {spec.bits} is not supported (4 or 8)")
        spec.groups(modules[name].in_features)  # refuses a group size that does not divide
    with torch.no_grad():
        if method == "rtn":
            done = {}
            for name, module in modules.items():
                codes, scales, zeros = rtn_quantize_weight(module.weight, specs[name])
                done[name] = _apply(module, QuantizedLinear(specs[name], codes, scales, zeros))
            return done
        if method == "gptq":
            if not calibration_batches:
                raise ValueError("gptq needs calibration_batches: input_ids tensors of the calibration text")
            found = gptq_layerwise(
                model, modules, specs, calibration_batches, damp_percent=damp_percent, desc_act=desc_act, block_size=block_size
            )
            return {name: QuantizedLinear(specs[name], *found[name]) for name in modules}
    raise ValueError(f"method {method!r} is not one of rtn, gptq")


def _untie_head(model: torch.nn.Module, head: torch.nn.Linear) -> None:
    """A head that shares its weight with the input embeddings gets a copy of its own before it
    is quantized: the embedding stays float (the model builder reads an Olive checkpoint's
    embeddings in float; the checkpoint unties them in config.json)."""
    import torch

    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(embeddings, "weight", None)
    if weight is not None and head.weight.data_ptr() == weight.data_ptr():
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)


def _apply(module: torch.nn.Linear, quantized: QuantizedLinear) -> QuantizedLinear:
    """Put the fake-quantized weight into ``module``; returns ``quantized``."""
    module.weight.data = quantized.dequantized().to(module.weight.dtype)
    return quantized
