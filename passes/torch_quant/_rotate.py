"""QuaRot's offline rotation of a Hugging Face decoder, folded into its weights.

QuaRot (Ashkboos et al. 2024, "QuaRot: Outlier-Free 4-Bit Inference in Rotated LLMs", Section 3)
builds on SliceGPT's computational invariance (Ashkboos et al. 2024, "SliceGPT", Sections
3.1-3.2): an RMSNorm without a scale commutes with any orthogonal Q (``norm(x Q) = norm(x) Q``,
since ``||x Q|| = ||x||``), so once each norm's scale is folded into the linear layers that read
it, the whole residual stream can be rotated by Q: embeddings ``E Q``, readers ``W Q``, writers
``Q^T W``. The model computes the same function in exact arithmetic, while the weights and the
residual stream lose their outlier channels: a random Hadamard matrix spreads a large column
over every column (QuaRot Section 3, "incoherence processing"), which is what lets 4-bit
round-to-nearest or GPTQ keep the model.

Only the rotations that fold into the weights are applied (QuaRot's R1 on the residual stream
and, optionally, R2 per attention head on the values); the online Hadamards QuaRot adds before
down_proj and on the key/value cache (R3, R4) would need kernels the checkpoint cannot carry.
The result is a standard Hugging Face checkpoint of the same architecture, with every RMSNorm
scale set to 1 and lm_head untied from the embeddings.

Layouts: Llama, Mistral, Qwen2, Qwen3 (separate q/k/v and gate/up) and Phi-3 (fused qkv_proj
and gate_up_proj). Qwen3's q_norm/k_norm act on the head dimension after q_proj/k_proj, which
R1 leaves alone; R2 touches only v_proj/o_proj. Anything else is refused by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch
    from torch import nn

RotateMode = Literal["hadamard", "random"]

#: model_type -> True when q/k/v and gate/up are fused (Phi-3)
SUPPORTED: dict[str, bool] = {"llama": False, "mistral": False, "qwen2": False, "qwen3": False, "phi3": True}

_REFUSED_WHY = {
    "gemma": "its RMSNorm scales by (1 + weight), which folding the scale into the next layer does not cover",
    "gemma2": "its RMSNorm scales by (1 + weight) and it has norms after attention and MLP (on the residual branch)",
    "gemma3": "its RMSNorm scales by (1 + weight) and it has norms after attention and MLP (on the residual branch)",
    "olmo2": "its norms sit after attention and MLP, on the residual branch, where no linear reads them",
    "cohere": "it normalises with LayerNorm (mean subtracted), which is not invariant under rotation",
}


class UnsupportedArchitecture(ValueError):
    """The model's layout is not one the rotation knows."""


@dataclass
class RotationReport:
    """What the rotation did, for a pass's details."""

    model_type: str
    hidden_size: int
    layers: int
    residual_rotation: str
    head_rotation: str | None
    untied_lm_head: bool
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "layers": self.layers,
            "residual_rotation": self.residual_rotation,
            "head_rotation": self.head_rotation,
            "untied_lm_head": self.untied_lm_head,
        }


def check_architecture(config: Any) -> str:
    """The config's model_type when the rotation supports it; else UnsupportedArchitecture naming it."""
    model_type = str(getattr(config, "model_type", "") or "")
    if model_type in SUPPORTED:
        return model_type
    names = ", ".join(getattr(config, "architectures", None) or []) or model_type or "unknown"
    supported = ", ".join(sorted(SUPPORTED))
    why = _REFUSED_WHY.get(model_type, "its layout is not one the rotation knows (RMSNorm before separate or fused attention/MLP inputs)")
    raise UnsupportedArchitecture(f"quarot cannot rotate a {model_type or 'model'} ({names}): {why}; it supports model types {supported}")


def is_power_of_two(size: int) -> bool:
    return size > 0 and size & (size - 1) == 0


def sylvester_hadamard(size: int) -> torch.Tensor:
    """The Sylvester Hadamard matrix of a power-of-two ``size`` (entries ±1, float64)."""
    import torch

    if not is_power_of_two(size):
        raise ValueError(f"a Sylvester Hadamard matrix needs a power-of-two size, got {size}")
    matrix = torch.ones(1, 1, dtype=torch.float64)
    while matrix.shape[0] < size:
        matrix = torch.cat([torch.cat([matrix, matrix], dim=1), torch.cat([matrix, -matrix], dim=1)], dim=0)
    return matrix


def orthogonal_matrix(size: int, mode: RotateMode, generator: torch.Generator) -> tuple[torch.Tensor, str]:
    """A random orthogonal ``size`` x ``size`` matrix (float64) and what it is.

    ``hadamard``: QuaRot's randomised Hadamard matrix (Section 3), ``H diag(s) / sqrt(size)``
    with H Sylvester's and s random signs; for a size that is not a power of two (QuaRot uses
    Paley constructions there, which this does not carry) a random orthogonal matrix instead.
    ``random``: Q of the QR decomposition of a Gaussian matrix, signs fixed by R's diagonal
    (Haar-distributed; SliceGPT Section 3.2 allows any orthogonal Q)."""
    import torch

    if mode == "hadamard" and is_power_of_two(size):
        signs = torch.randint(0, 2, (size,), generator=generator).to(torch.float64) * 2 - 1
        return sylvester_hadamard(size) * signs / math.sqrt(size), "hadamard"
    gaussian = torch.randn(size, size, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
    return q, "random orthogonal (size not a power of two)" if mode == "hadamard" else "random orthogonal"


def _set(linear: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    linear.weight.data = weight.to(linear.weight.dtype)
    if bias is not None:
        linear.bias.data = bias.to(linear.bias.dtype)


def _fuse_norm(norm: nn.Module, readers: list[nn.Module]) -> None:
    """SliceGPT Section 3.1 / QuaRot Section 3: fold an RMSNorm's scale into the linears that read
    its output (``W diag(w)``), leaving a norm with scale 1, which commutes with rotations."""
    import torch

    if getattr(norm, "bias", None) is not None:
        raise UnsupportedArchitecture(f"{type(norm).__name__} has a bias: only RMSNorm (scale only) can be fused")
    scale = norm.weight.data.double()
    for linear in readers:
        _set(linear, linear.weight.data.double() * scale)
    norm.weight.data = torch.ones_like(norm.weight.data)


def _read(linear: nn.Module, q: torch.Tensor) -> None:
    """A linear reading the rotated stream: ``W <- W Q`` (QuaRot Section 3, R1 on inputs)."""
    _set(linear, linear.weight.data.double() @ q)


def _write(linear: nn.Module, q: torch.Tensor) -> None:
    """A linear writing the rotated stream: ``W <- Q^T W``, ``b <- Q^T b`` (QuaRot Section 3, R1 on outputs)."""
    bias = None if linear.bias is None else q.T @ linear.bias.data.double()
    _set(linear, q.T @ linear.weight.data.double(), bias)


def _untie(model: nn.Module) -> bool:
    """Give lm_head its own weight when it shares the embeddings' (R1 enters them from opposite
    sides: ``E Q`` for the embeddings, ``W Q`` for lm_head after the final norm's scale)."""
    from torch import nn

    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head.weight is embed.weight or head.weight.data_ptr() == embed.weight.data_ptr()
    for config in (model.config, getattr(model.config, "text_config", None)):
        if config is not None and getattr(config, "tie_word_embeddings", False):
            config.tie_word_embeddings = False
            tied = True
    if tied:
        head.weight = nn.Parameter(embed.weight.data.clone())
    return tied


@dataclass
class _Block:
    """One decoder layer's modules, by their role in the residual stream."""

    attn_norm: nn.Module
    attn_readers: list[nn.Module]
    out_proj: nn.Module
    mlp_norm: nn.Module
    mlp_readers: list[nn.Module]
    down_proj: nn.Module
    #: the linear producing the values and the row offset where they start in its output
    values: tuple[nn.Module, int]


def _blocks(model: nn.Module, fused: bool) -> list[_Block]:
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    blocks = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if fused:
            v_start = (config.num_attention_heads + config.num_key_value_heads) * head_dim
            readers, values, mlp_readers = [attn.qkv_proj], (attn.qkv_proj, v_start), [mlp.gate_up_proj]
        else:
            readers, values, mlp_readers = [attn.q_proj, attn.k_proj, attn.v_proj], (attn.v_proj, 0), [mlp.gate_proj, mlp.up_proj]
        blocks.append(
            _Block(layer.input_layernorm, readers, attn.o_proj, layer.post_attention_layernorm, mlp_readers, mlp.down_proj, values)
        )
    return blocks


def _rotate_heads(block: _Block, h: torch.Tensor, head_dim: int) -> None:
    """QuaRot Section 3 (R2): the values of each head leave v_proj rotated by H (rows
    ``H^T W_v,h``, bias ``H^T b_v,h``); attention mixes values by weights that sum to 1, so each
    head's output is rotated too, and o_proj's input columns take H back (``W_o,h H``). One H
    serves every head, so grouped-query heads sharing a key/value head stay consistent."""
    linear, start = block.values
    weight = linear.weight.data.double()
    bias = None if linear.bias is None else linear.bias.data.double()
    for row in range(start, weight.shape[0], head_dim):
        weight[row : row + head_dim] = h.T @ weight[row : row + head_dim]
        if bias is not None:
            bias[row : row + head_dim] = h.T @ bias[row : row + head_dim]
    _set(linear, weight, bias)
    out = block.out_proj.weight.data.double()
    for column in range(0, out.shape[1], head_dim):
        out[:, column : column + head_dim] = out[:, column : column + head_dim] @ h
    _set(block.out_proj, out)


def rotate_model(model: nn.Module, *, seed: int = 0, rotate_mode: RotateMode = "hadamard", rotate_heads: bool = True) -> RotationReport:
    """Rotate a supported Hugging Face causal LM in place (float64 arithmetic, weights keep their
    dtype); the model computes the same logits up to rounding. Returns what was done."""
    import torch

    model_type = check_architecture(model.config)
    fused = SUPPORTED[model_type]
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    blocks = _blocks(model, fused)
    with torch.no_grad():
        untied = _untie(model)
        # SliceGPT Section 3.1 / QuaRot Section 3: every RMSNorm's scale into its readers
        for block in blocks:
            _fuse_norm(block.attn_norm, block.attn_readers)
            _fuse_norm(block.mlp_norm, block.mlp_readers)
        _fuse_norm(model.model.norm, [model.lm_head])
        # QuaRot Section 3 (R1): one rotation of the residual stream, entered at the embeddings
        q, residual = orthogonal_matrix(config.hidden_size, rotate_mode, generator)
        embed = model.get_input_embeddings()
        embed.weight.data = (embed.weight.data.double() @ q).to(embed.weight.dtype)
        for block in blocks:
            for linear in (*block.attn_readers, *block.mlp_readers):
                _read(linear, q)
            _write(block.out_proj, q)
            _write(block.down_proj, q)
        _read(model.lm_head, q)
        head_rotation = None
        if rotate_heads:
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            h, head_rotation = orthogonal_matrix(head_dim, rotate_mode, generator)
            for block in blocks:
                _rotate_heads(block, h, head_dim)
    notes = []
    if "not a power of two" in residual:
        notes.append(f"hidden size {config.hidden_size} is not a power of two: the residual rotation is a random orthogonal matrix")
    if head_rotation and "not a power of two" in head_rotation:
        notes.append("the head dimension is not a power of two: the per-head rotation is a random orthogonal matrix")
    return RotationReport(model_type, config.hidden_size, len(blocks), residual, head_rotation, untied, notes)
