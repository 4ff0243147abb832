"""What ``selective_mixed_precision`` chooses from, and how it ranks it: a decoder's linear modules
as selection units (q/k/v of one attention share a precision: the ONNX build fuses them), the
presets and the promotion rule of ``passes.quantize.precision_select`` (Olive's, shared with the
ONNX-level ``mixed_precision``), and two sensitivity scores in PyTorch, each Olive's:

- ``snr`` (no data): the signal-to-noise ratio, in dB, of a unit's weights against their
  round-to-nearest copy at the low precision (sums of squares over the unit's members); the
  lowest ratio is the most sensitive.
- ``kld_gradient`` (calibration token windows): the KL divergence ``KL(float || low)`` of the
  next-token distributions of the float model (teacher) and of the model with every candidate
  fake-quantized at the low precision (student), averaged over positions; its gradient ``g`` with
  respect to each low-precision weight ``W_low``, averaged over the windows, gives the alignment
  ``sum(g * (W_low - W_high))`` (``W_high``: the float weight at the high precision): to first
  order, the drop in the KL divergence when the module moves to the high precision. A unit's
  score is its members' alignment per million weights; the highest is the most sensitive (Olive
  negates it and sorts ascending: the same order).

Scores here are "higher: more sensitive", as ``precision_select.promote`` takes them.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING

from passes.quantize import precision_select as select
from passes.torch_quant._grid import QuantSpec, dequantize
from passes.torch_quant._quantize import rtn_quantize_weight, select_linear_layers

if TYPE_CHECKING:
    import torch

_EPS = 1e-12


def candidates(model: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    """The linear modules a choice is made among: those of the decoder layers, and ``lm_head``
    (Olive scores every linear module of the causal LM)."""
    import torch

    head = isinstance(getattr(model, "lm_head", None), torch.nn.Linear)
    return select_linear_layers(model, lm_head=head)


def selection_units(modules: dict[str, torch.nn.Linear]) -> dict[str, list[select.Weight]]:
    """Units by key: one per module, except q/k/v of one attention, grouped (``precision_select.units``)."""
    weights = [select.weight_named(name, int(module.weight.numel())) for name, module in modules.items()]
    return select.units(weights)


def fake_quantized(weight: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """``weight`` rounded to ``spec``'s grid and back to float (its dtype)."""
    codes, scales, zeros = rtn_quantize_weight(weight, spec)
    return dequantize(codes, scales, zeros, spec).to(weight.dtype)


def snr_scores(modules: dict[str, torch.nn.Linear], units: dict[str, list[select.Weight]], low: QuantSpec) -> dict[str, float]:
    """Each unit's ``-SNR`` in dB at ``low`` (higher: more sensitive)."""
    import torch

    scores = {}
    with torch.no_grad():
        for key, members in units.items():
            signal = noise = 0.0
            for member in members:
                weight = modules[member.node].weight.detach().double()
                signal += float(torch.sum(weight * weight))
                noise += float(torch.sum((weight - fake_quantized(weight, low)) ** 2))
            scores[key] = -10 * math.log10(max(signal, _EPS * _EPS) / max(noise, _EPS * _EPS))
    return scores


def kl_div(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """``KL(teacher || student)`` of the next-token distributions, per position."""
    import torch

    student = torch.nn.functional.log_softmax(student_logits.float(), dim=-1)
    teacher = torch.nn.functional.softmax(teacher_logits.float(), dim=-1)
    return torch.nn.functional.kl_div(student, teacher, reduction="none").sum(-1)


def kld_alignments(
    model: torch.nn.Module, names: list[str], low: QuantSpec, high: QuantSpec, windows: list[torch.Tensor]
) -> dict[str, float]:
    """Each module's alignment ``sum(mean_grad * (W_low - W_high))`` (see the module docstring);
    ``model`` (float, the teacher) is left as it was."""
    import torch

    student = copy.deepcopy(model).eval()
    for parameter in student.parameters():
        parameter.requires_grad_(False)
    layers = dict(student.named_modules())
    originals = dict(model.named_modules())
    for name in names:
        layer = layers[name]
        layer.weight = torch.nn.Parameter(fake_quantized(layer.weight.detach(), low), requires_grad=True)
    with torch.enable_grad():
        for ids in windows:  # the weights' .grad sums the windows' gradients
            with torch.no_grad():
                teacher = model(input_ids=ids, use_cache=False).logits
            loss = kl_div(student(input_ids=ids, use_cache=False).logits, teacher).mean()
            loss.backward()
    alignments = {}
    with torch.no_grad():
        for name in names:
            weight = layers[name].weight
            if weight.grad is None:
                raise ValueError(f"{name} got no gradient from the KL divergence: it is not on the path to the logits")
            delta = weight.detach() - fake_quantized(originals[name].weight.detach(), high)
            alignments[name] = float(torch.sum(weight.grad.double() * delta.double())) / len(windows)
    return alignments


def kld_scores(alignments: dict[str, float], units: dict[str, list[select.Weight]]) -> dict[str, float]:
    """Each unit's alignment per million weights (higher: more sensitive)."""
    return {key: sum(alignments[m.node] for m in members) / (max(sum(m.size for m in members), 1) / 1e6) for key, members in units.items()}
