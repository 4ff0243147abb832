"""The tensors of one MatMulNBits node as a DequantizeLinear's inputs: unpack the node's packed
rows (low bits first, one row per output column), drop the padding of the last block, shift to
signed when asked, and pack them again as ONNX's INT4 / UINT4 / INT8 / UINT8 tensors (low nibble
first). The layout follows Olive's ``MatMulNBitsToQDQ``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class DqLayout:
    k: int
    n: int
    bits: int
    block_size: int
    signed: bool  # int4/int8 rather than uint4/uint8
    transposed: bool  # weight stored [N, K] and a Transpose after the DQ (use_transpose_op)

    @property
    def blocks(self) -> int:
        return math.ceil(self.k / self.block_size)

    @property
    def per_axis(self) -> bool:
        """One block along K: a per-axis DQ (one scale per output column) rather than a blocked one."""
        return self.blocks == 1

    @property
    def midpoint(self) -> int:
        """MatMulNBits' zero point when it has none (8 for 4 bits): unsigned storage of signed values."""
        return 1 << (self.bits - 1)

    @property
    def axis(self) -> int:
        # a blocked DQ blocks along K (axis 0 of [K, N]); a per-axis one scales along N (axis 1)
        return (1 if self.transposed else 0) ^ (1 if self.per_axis else 0)


def unpack_rows(packed: np.ndarray, bits: int, columns: int) -> np.ndarray:
    """[rows, bytes] uint8 -> [rows, columns] uint8 of ``bits``-bit values, low bits first."""
    if bits == 8:
        return packed[:, :columns]
    per_byte = 8 // bits
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    values = (packed[:, :, None] >> shifts[None, None, :]) & ((1 << bits) - 1)
    return values.reshape(packed.shape[0], -1)[:, :columns].astype(np.uint8)


def pack_flat(values: np.ndarray, bits: int, signed: bool) -> bytes:
    """Values (already in range) as the raw data of an ONNX tensor of ``bits`` bits."""
    flat = values.flatten().astype(np.int8 if signed else np.uint8)
    if bits == 8:
        return flat.tobytes()
    per_byte = 8 // bits
    if len(flat) % per_byte:
        flat = np.pad(flat, (0, per_byte - len(flat) % per_byte))
    mask = (1 << bits) - 1
    result = (flat[0::per_byte] & mask).astype(np.uint8)
    for i in range(1, per_byte):
        result |= ((flat[i::per_byte] & mask) << (i * bits)).astype(np.uint8)
    return result.tobytes()


def onnx_int_type(bits: int, signed: bool) -> int:
    from onnx import TensorProto

    return {
        (4, True): TensorProto.INT4,
        (4, False): TensorProto.UINT4,
        (8, True): TensorProto.INT8,
        (8, False): TensorProto.UINT8,
    }[(bits, signed)]


def _orient(values: np.ndarray, layout: DqLayout) -> np.ndarray:
    """[N, columns] as the DQ stores it: [columns, N] unless transposed; 1-D when per-axis."""
    if layout.per_axis and values.shape[1] == 1:
        return values.reshape(-1)
    return values if layout.transposed else values.T


def quantized_tensor(name: str, values: np.ndarray, layout: DqLayout) -> Any:
    """An integer tensor (weight or zero points) from unsigned [N, columns] values."""
    from onnx import helper

    shifted = values.astype(np.int16) - (layout.midpoint if layout.signed else 0)
    oriented = _orient(shifted, layout)
    return helper.make_tensor(
        name, onnx_int_type(layout.bits, layout.signed), list(oriented.shape), pack_flat(oriented, layout.bits, layout.signed), raw=True
    )


def weight_tensor(name: str, packed: np.ndarray, layout: DqLayout) -> Any:
    """MatMulNBits' B ([N, blocks, block bytes] uint8) as the DQ's quantized weight."""
    rows = unpack_rows(packed.reshape(layout.n, -1), layout.bits, layout.k)
    weight = rows if layout.transposed else rows.T
    from onnx import helper

    shifted = weight.astype(np.int16) - (layout.midpoint if layout.signed else 0)
    return helper.make_tensor(
        name, onnx_int_type(layout.bits, layout.signed), list(shifted.shape), pack_flat(shifted, layout.bits, layout.signed), raw=True
    )


def scale_tensor(name: str, scales: np.ndarray, layout: DqLayout) -> Any:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.ascontiguousarray(_orient(scales.reshape(layout.n, layout.blocks), layout)), name)


def zero_points(packed: np.ndarray | None, layout: DqLayout) -> np.ndarray:
    """MatMulNBits' zero points as unsigned [N, blocks] values (its default when it has none)."""
    if packed is None:
        return np.full((layout.n, layout.blocks), layout.midpoint, dtype=np.uint8)
    return unpack_rows(packed.reshape(layout.n, -1), layout.bits, layout.blocks)
