"""GPTQ on one weight matrix: Frantar, Ashkboos, Hoefler, Alistarh, "GPTQ: Accurate Post-Training
Quantization for Generative Pre-trained Transformers" (ICLR 2023, arXiv:2210.17323).

The layer-wise problem (section 3): find quantized ``Q`` minimizing ``||W X - Q X||²`` over the
calibration inputs ``X`` of the layer; its Hessian is ``H = 2 X Xᵀ`` (accumulated by
``HessianAccumulator`` as a running mean over the samples' tokens, as the reference code does).

``gptq_quantize_weight`` is Algorithm 1 (section 4, "Step 3"):

- dead inputs (``H_jj == 0``) are given ``H_jj = 1`` and their weights zeroed (reference code);
- dampening: ``λ = damp_percent · mean(diag H)`` added to the diagonal ("Step 3: Cholesky
  Reformulation", numerical stability);
- ``H⁻¹`` through its Cholesky factor: ``U = chol(H⁻¹)ᵀ`` (upper), whose rows give the error
  propagation of the remaining columns (section 4, "Step 3"); computed on one thread
  (``inverse_cholesky``): MKL's factorization depends on the thread count, and the codes written
  must not depend on the machine or the worker's threads;
- columns processed in blocks of ``block_size`` ("Step 2: Lazy Batch-Updates"): inside a block each
  column is rounded, its error ``(w - q) / U_jj`` propagated to the block's later columns, and the
  block's accumulated errors applied to every later column in one matrix product;
- the grid of a group is fixed when the sweep reaches its first column ("group-wise" in section
  5's set-up, as the reference code does).

Act order (``desc_act``, the reference code's ``--act-order``, section 5 "heuristic"): columns
are processed by decreasing ``H_jj``. With groups, the checkpoint format read by the model
builder has no ``g_idx`` (the olive format's groups are contiguous input ranges), so the grid
of every group is computed from the original weights before the sweep ("static groups", as
AutoGPTQ's ``static_groups``): act order changes the order of rounding, never which grid a
weight is on, and the checkpoint keeps contiguous groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from passes.torch_quant._grid import QuantSpec, dequantize, find_qparams, quantize

if TYPE_CHECKING:
    import torch


class HessianAccumulator:
    """``H = 2/N Σ x xᵀ`` over the N input rows seen so far of a linear layer (a running mean)."""

    def __init__(self, features: int) -> None:
        import torch

        self.hessian = torch.zeros((features, features), dtype=torch.float32)
        self.rows = 0

    def add(self, inputs: torch.Tensor) -> None:
        """Accumulate the inputs ``(..., features)`` of one forward call."""
        import math

        rows = inputs.reshape(-1, inputs.shape[-1]).float()
        count = rows.shape[0]
        self.hessian *= self.rows / (self.rows + count)
        self.rows += count
        rows = math.sqrt(2 / self.rows) * rows
        self.hessian += rows.t() @ rows


def inverse_cholesky(hessian: torch.Tensor) -> torch.Tensor:
    """``chol(H⁻¹)ᵀ`` (upper), computed on one thread: torch's Cholesky factorization and inverse
    (MKL's LAPACK) give results that depend on the number of threads (measured: 1 and 2 threads
    differ in the last bits, and so do the quantized codes), and one thread gives the same
    factor on every machine, whatever its cores or the worker's thread setting."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(hessian)), upper=True)
    finally:
        torch.set_num_threads(threads)


def gptq_quantize_weight(  # long: Algorithm 1 reads best as one loop, as in the paper
    weight: torch.Tensor,
    hessian: torch.Tensor,
    spec: QuantSpec,
    *,
    block_size: int = 128,
    damp_percent: float = 0.01,
    desc_act: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPTQ of ``weight`` ``(out, in)`` given the Hessian ``(in, in)`` of its inputs.

    Returns ``(codes, scales, zeros)``: uint8 codes ``(out, in)`` and the grid ``(out, groups)``
    (float32 scales, int32 zero points), as ``_grid.find_qparams`` gives them."""
    import torch

    W = weight.detach().float().clone()
    H = hessian.detach().float().clone()
    out, columns = W.shape
    groups, width = spec.groups(columns), spec.width(columns)

    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0

    static = desc_act and groups > 1
    if desc_act or groups == 1:
        scales, zeros = find_qparams(W, spec)  # the grids of the original weights (static groups)
    else:
        scales = torch.zeros((out, groups), dtype=torch.float32)
        zeros = torch.zeros((out, groups), dtype=torch.int32)
    perm = torch.argsort(torch.diag(H), descending=True) if desc_act else torch.arange(columns)
    W, H = W[:, perm], H[perm][:, perm]

    H[range(columns), range(columns)] += damp_percent * torch.mean(torch.diag(H))
    U = inverse_cholesky(H)

    column_grid = QuantSpec(spec.bits, -1, spec.sym)  # one column against its group's grid
    Q = torch.zeros_like(W)
    for start in range(0, columns, block_size):
        stop = min(start + block_size, columns)
        W1 = W[:, start:stop].clone()
        Err1 = torch.zeros_like(W1)
        U1 = U[start:stop, start:stop]
        for i in range(stop - start):
            column = start + i
            original = int(perm[column])
            group = original // width
            if not static and groups > 1 and original % width == 0:
                # the group's later columns are still being updated: take them from W1 where they are
                current = torch.cat([W1[:, i:], W[:, stop:]], dim=1)[:, :width]
                s, z = find_qparams(current, spec)
                scales[:, group], zeros[:, group] = s[:, 0], z[:, 0]
            w = W1[:, i]
            s, z = scales[:, group : group + 1], zeros[:, group : group + 1]
            q = dequantize(quantize(w.unsqueeze(1), s, z, column_grid), s, z, column_grid)[:, 0]
            Q[:, column] = q
            error = (w - q) / U1[i, i]
            W1[:, i:] -= error.unsqueeze(1) @ U1[i, i:].unsqueeze(0)
            Err1[:, i] = error
        W[:, stop:] -= Err1 @ U[start:stop, stop:]

    Q = Q[:, torch.argsort(perm)]
    return quantize(Q, scales, zeros, spec), scales, zeros
