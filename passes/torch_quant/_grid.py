"""The integer grid of weight-only quantization: per-group scales and zero points, round to
nearest, and the uint8 packing of ONNX Runtime GenAI's ``olive`` checkpoint format.

Conventions (those of Olive's ``WeightQuantizer`` and of ONNX Runtime's MatMulNBits):

- unsigned codes ``q`` in ``[0, 2**bits - 1]``, ``w ≈ (q - zero) * scale``;
- groups run along the last axis (the input features of an ``nn.Linear`` weight ``(out, in)``);
  ``group_size == -1`` is one group per output row;
- symmetric: ``scale = max|w| / ((2**bits - 1) / 2)`` and ``zero = 2**(bits-1)`` (MatMulNBits'
  default zero point, so a symmetric checkpoint stores no ``qzeros``); asymmetric: the range
  ``[min(w, 0), max(w, 0)]`` over ``2**bits - 1`` steps, ``zero = round(-min / scale)``;
- packing: ``8 // bits`` codes per byte along the last axis, the first in the low bits.

Imports torch inside functions only where the caller may not have it loaded yet; every function
here takes and returns torch tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class QuantSpec:
    """How one weight is quantized: ``bits`` (4 or 8), ``group_size`` (-1 = per output row) and
    ``sym`` (symmetric, no stored zero points)."""

    bits: int = 4
    group_size: int = 128
    sym: bool = False

    @property
    def maxq(self) -> int:
        return (1 << self.bits) - 1

    def groups(self, in_features: int) -> int:
        """How many groups a row of ``in_features`` weights has; refuses a size that does not divide."""
        size = in_features if self.group_size == -1 else self.group_size
        if in_features % size:
            raise ValueError(f"group_size {self.group_size} does not divide the {in_features} input features of a weight")
        return in_features // size

    def width(self, in_features: int) -> int:
        """The number of weights in one group of a row of ``in_features``."""
        return in_features if self.group_size == -1 else self.group_size


def find_qparams(weight: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales (float32) and zero points (int32), both ``(out, groups)``, of a weight ``(out, in)``."""
    import torch

    out, size = weight.shape
    grouped = weight.float().reshape(out, spec.groups(size), spec.width(size))
    zero = torch.zeros((), dtype=torch.float32)
    low = torch.minimum(grouped.amin(-1), zero)
    high = torch.maximum(grouped.amax(-1), zero)
    if spec.sym:
        high = torch.maximum(low.abs(), high)
        low = torch.where(low < 0, -high, low)
    empty = (low == 0) & (high == 0)
    low = torch.where(empty, -torch.ones_like(low), low)
    high = torch.where(empty, torch.ones_like(high), high)
    scales = (high - low) / spec.maxq
    if spec.sym:
        zeros = torch.full_like(scales, float((spec.maxq + 1) // 2))
    else:
        zeros = torch.round(-low / scales)
    return scales, zeros.clamp(0, spec.maxq).to(torch.int32)


def quantize(weight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """The codes (uint8, the weight's shape) of ``weight`` on the grid ``scales``/``zeros``."""
    import torch

    out, size = weight.shape
    grouped = weight.float().reshape(out, spec.groups(size), spec.width(size))
    codes = torch.round(grouped / scales.unsqueeze(-1) + zeros.unsqueeze(-1)).clamp(0, spec.maxq)
    return codes.reshape(out, size).to(torch.uint8)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """The float32 weight ``(codes - zero) * scale`` of ``codes`` ``(out, in)``."""
    out, size = codes.shape
    grouped = codes.reshape(out, spec.groups(size), spec.width(size)).float()
    return ((grouped - zeros.unsqueeze(-1).float()) * scales.unsqueeze(-1)).reshape(out, size)


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes ``(rows, n)`` in ``[0, 2**bits)`` packed into uint8 ``(rows, ceil(n * bits / 8))``:
    ``8 // bits`` codes per byte along the last axis, the first in the low bits (a short last
    byte is padded with zeros)."""
    import torch

    per_byte = 8 // bits
    padding = (-codes.shape[-1]) % per_byte
    values = torch.nn.functional.pad(codes.to(torch.uint8), (0, padding)) if padding else codes.to(torch.uint8)
    packed = torch.zeros((*values.shape[:-1], values.shape[-1] // per_byte), dtype=torch.uint8)
    for slot in range(per_byte):
        packed |= values[..., slot::per_byte] << (bits * slot)
    return packed


def unpack(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """The first ``count`` codes of each row of ``packed`` (the inverse of ``pack``)."""
    import torch

    per_byte = 8 // bits
    mask = (1 << bits) - 1
    slots = [(packed >> (bits * slot)) & mask for slot in range(per_byte)]
    return torch.stack(slots, dim=-1).reshape(*packed.shape[:-1], -1)[..., :count].to(torch.uint8)
