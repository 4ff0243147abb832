"""k-quant weight-only quantization of MatMul weights into ``com.microsoft:MatMulNBits``, in numpy.

The method is llama.cpp's (ggml-quants.c, ``make_qkx2_quants``), as onnxruntime's vendored
neural-compressor code and Olive's ``OnnxKQuantQuantization`` port it: per block of
``block_size`` weights along K, asymmetric codes ``0 .. 2^bits - 1``; starting from the block's
min/max, 20 candidate scales are tried and each is refined by weighted least squares (weights
``rms(block) + |w|``, so large weights count more); the scale and minimum with the smallest
weighted squared error win.

Written here rather than through ``KQuantWeightOnlyQuantConfig``: onnxruntime 1.31.1's k-quant
path fails on any weight whose K holds an odd number of blocks ("cannot reshape array of size 96
into shape (64,newaxis)": it packs two 4-bit zero points per byte without padding), which is most
real hidden sizes at block 128 (896 = 7 x 128).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from passes.quantize.nbits_plan import Spec

if TYPE_CHECKING:
    import onnx

_STEPS = 20
_DELTA = 0.1
_START = -1.0


def kquant_blocks(blocks: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``blocks`` [n, block_size] float32 -> (codes uint8 [n, block_size], scales [n], zero points uint8 [n])."""
    data = blocks.astype(np.float32)
    maxq = float(2**bits - 1)
    weights = np.sqrt(np.mean(data**2, axis=1, keepdims=True)) + np.abs(data)
    rmin = np.min(data, axis=1, keepdims=True)
    rmax = np.max(data, axis=1, keepdims=True)
    spread = np.where(rmax > rmin, rmax - rmin, 1.0)
    sum_w = np.sum(weights, axis=1, keepdims=True)
    sum_x = np.sum(weights * data, axis=1, keepdims=True)

    scale = np.where(rmax > rmin, spread / maxq, 1.0)
    best = np.sum(weights * (scale * np.clip(np.round((data - rmin) / scale), 0, maxq) + rmin - data) ** 2, axis=1, keepdims=True)
    for step in range(_STEPS):
        iscale = np.where(rmax > rmin, (_START + _DELTA * step + maxq) / spread, 1.0)
        codes = np.clip(np.round(iscale * (data - rmin)), 0, maxq)
        wq = weights * codes
        sum_l = np.sum(wq, axis=1, keepdims=True)
        sum_l2 = np.sum(wq * codes, axis=1, keepdims=True)
        sum_xl = np.sum(wq * data, axis=1, keepdims=True)
        det = sum_w * sum_l2 - sum_l**2
        safe = np.where(det != 0, det, 1.0)
        this_scale = np.where(det != 0, (sum_w * sum_xl - sum_x * sum_l) / safe, scale)
        this_min = np.where(det != 0, (sum_l2 * sum_x - sum_l * sum_xl) / safe, rmin)
        error = np.sum(weights * (this_scale * codes + this_min - data) ** 2, axis=1, keepdims=True)
        better = (error < best) & (this_scale > 0)
        best = np.where(better, error, best)
        scale = np.where(better, this_scale, scale)
        rmin = np.where(better, this_min, rmin)
    zero_point = np.clip(np.round(-rmin / scale), 0, maxq)
    codes = np.clip(np.round(data / scale + zero_point), 0, maxq)
    return codes.astype(np.uint8), scale[:, 0], zero_point[:, 0].astype(np.uint8)


def kquant_weight(weight: np.ndarray, bits: int, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A [K, N] weight -> MatMulNBits' B [N, blocks, block_size * bits / 8], scales [N * blocks]
    (the weight's dtype) and zero points (4 bits: two per byte, [N * ceil(blocks / 2)]; 8 bits: [N * blocks])."""
    rows, cols = weight.shape
    blocks = -(-rows // block_size)
    padded = np.zeros((blocks * block_size, cols), dtype=np.float32)
    padded[:rows] = weight
    codes, scales, zeros = kquant_blocks(padded.T.reshape(cols * blocks, block_size), bits)
    if bits == 4:
        packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
        per_column = np.zeros((cols, blocks + blocks % 2), dtype=np.uint8)
        per_column[:, :blocks] = zeros.reshape(cols, blocks)
        zero_points = (per_column[:, 0::2] | (per_column[:, 1::2] << 4)).astype(np.uint8).reshape(-1)
    else:
        packed, zero_points = codes, zeros
    return packed.reshape(cols, blocks, block_size * bits // 8), scales.astype(weight.dtype), zero_points


def kquant_model(model: onnx.ModelProto, specs: dict[str, Spec], accuracy_level: int | None) -> int:
    """Turn the main graph's MatMul nodes named in ``specs`` (a constant 2-D weight each; bits 4 or
    8) into MatMulNBits in place; drop the float weights nothing reads any more. Returns how many."""
    from onnx import helper, numpy_helper

    from passes.quantize.onnx_facts import iter_nodes

    initializers = {t.name: t for t in model.graph.initializer}
    added: set[str] = set()
    replaced: set[str] = set()
    done = 0
    for node in model.graph.node:
        spec = specs.get(node.name)
        if spec is None or node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            continue
        weight = numpy_helper.to_array(initializers[node.input[1]])
        packed, scales, zero_points = kquant_weight(weight, spec.bits, spec.block_size)
        stem = f"{node.input[1]}_Q{spec.bits}G{spec.block_size}"
        names = [f"{stem}", f"{stem}_scales", f"{stem}_zero_points"]
        for name, value in zip(names, (packed, scales, zero_points), strict=True):
            if name not in added:  # a weight shared by several MatMuls is quantized once
                model.graph.initializer.append(numpy_helper.from_array(value, name))
                added.add(name)
        rows, cols = weight.shape
        attributes = {"K": rows, "N": cols, "bits": spec.bits, "block_size": spec.block_size}
        if accuracy_level:
            attributes["accuracy_level"] = accuracy_level
        replacement = helper.make_node(
            "MatMulNBits",
            [node.input[0], *names],
            list(node.output),
            name=f"{node.name}_Q{spec.bits}",
            domain="com.microsoft",
            **attributes,
        )
        replaced.add(node.input[1])
        node.CopyFrom(replacement)
        done += 1
    used = {name for n in iter_nodes(model.graph) for name in n.input} | {o.name for o in model.graph.output}
    kept = [t for t in model.graph.initializer if t.name in used or t.name not in replaced]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return done
