"""The quantized checkpoint folder: the ``olive`` format of ONNX Runtime GenAI's model builder
(``onnxruntime_genai/models/loaders/olive.py``), which the builder turns into MatMulNBits nodes
carrying these very codes, scales and zero points.

For every quantized ``nn.Linear`` named ``N`` the safetensors file holds, instead of ``N.weight``:

- ``N.qweight``: uint8 ``(out, in * bits / 8)``, the codes packed along the input axis
  (``_grid.pack``: first code in the low bits), which the builder reshapes to MatMulNBits'
  ``(out, blocks, block_bytes)``;
- ``N.scales``: float32 ``(out, groups)``;
- ``N.qzeros``: uint8 ``(out, ceil(groups * bits / 8))``, the zero points packed the same way,
  only when asymmetric (a symmetric weight uses MatMulNBits' default zero point ``2**(bits-1)``);
- ``N.bias`` as it was.

config.json gains ``quantization_config``: ``quant_method: olive``, ``bits``, ``group_size``,
``symmetric``, ``lm_head``, ``desc_act: false`` (groups are contiguous: no ``g_idx``), and
``overrides`` by module name for every module whose bits, group size or symmetry differ from the
defaults (the builder reads bits and group size from it, module by module).

Fused projections (Phi-3's ``qkv_proj`` and ``gate_up_proj``) are written split into
``q_proj``/``k_proj``/``v_proj`` and ``gate_proj``/``up_proj`` (rows of the output axis; groups run
along the input axis, so the split is exact): the builder's olive loader splits a fused
``qzeros`` at the wrong rows, and reads split names for every family.

A quantized ``lm_head`` of a model with tied embeddings is written as its own tensors and
``tie_word_embeddings`` set to false (the embedding stays float: the builder reads float
embeddings only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from passes.torch_quant._grid import QuantSpec, pack

if TYPE_CHECKING:
    import torch

WEIGHTS_FILE = "model.safetensors"


def _tensors(name: str, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, spec: QuantSpec) -> dict[str, torch.Tensor]:
    import torch

    tensors = {f"{name}.qweight": pack(codes, spec.bits), f"{name}.scales": scales.to(torch.float32).contiguous()}
    if not spec.sym:
        tensors[f"{name}.qzeros"] = pack(zeros, spec.bits)
    return tensors


def _split_rows(name: str, config: Any, rows: int) -> list[tuple[str, int, int]]:
    """``(new name, first row, end row)`` of a fused projection's parts; the name alone otherwise."""
    parent, leaf = name.rsplit(".", 1) if "." in name else ("", name)
    text = getattr(config, "get_text_config", lambda: config)()
    if leaf == "qkv_proj":
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        q = text.num_attention_heads * head_dim
        kv = (rows - q) // 2
        return [(f"{parent}.q_proj", 0, q), (f"{parent}.k_proj", q, q + kv), (f"{parent}.v_proj", q + kv, rows)]
    if leaf == "gate_up_proj":
        half = rows // 2
        return [(f"{parent}.gate_proj", 0, half), (f"{parent}.up_proj", half, rows)]
    return [(name, 0, rows)]


def _packed_state(
    model: torch.nn.Module, quantized: dict[str, Any], default: QuantSpec
) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """The model's tensors with the quantized modules packed (fused ones split), and the
    overrides of the modules whose spec differs from ``default``."""
    state = {name: tensor.detach().clone().contiguous() for name, tensor in model.state_dict().items()}
    overrides: dict[str, dict[str, Any]] = {}
    for name, item in quantized.items():
        state.pop(f"{name}.weight")
        bias = state.pop(f"{name}.bias", None)
        for part, first, end in _split_rows(name, model.config, item.codes.shape[0]):
            rows = slice(first, end)
            state.update(_tensors(part, item.codes[rows], item.scales[rows], item.zeros[rows], item.spec))
            if bias is not None:
                state[f"{part}.bias"] = bias[rows].contiguous()
            if item.spec != default:
                overrides[part] = {"bits": item.spec.bits, "group_size": item.spec.group_size, "symmetric": item.spec.sym}
    return state, overrides


def _config(model: torch.nn.Module, untie: bool) -> dict[str, Any]:
    """The model's config.json as a dict, with tied embeddings undone when ``untie``."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:  # config.json as save_pretrained writes it (the builder reads that)
        model.config.save_pretrained(scratch)
        config: dict[str, Any] = json.loads((Path(scratch) / "config.json").read_text())
    config["architectures"] = config.get("architectures") or [type(model).__name__]
    if untie:
        config["tie_word_embeddings"] = False
        if isinstance(config.get("text_config"), dict):
            config["text_config"]["tie_word_embeddings"] = False
    return config


def write_checkpoint(
    model: torch.nn.Module,
    tokenizer: Any,
    out_dir: Path | str,
    quantized: dict[str, Any],
    *,
    bits: int,
    group_size: int,
    sym: bool,
    lm_head: bool = False,
    extra_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the ``olive`` checkpoint folder of ``model`` (config.json, model.safetensors,
    generation_config.json, the tokenizer's files) with the ``quantized`` modules
    (``quantize_linear_layers``' result) in packed form; the defaults ``bits``/``group_size``/``sym``
    go into ``quantization_config``, every module that differs into its ``overrides``.
    ``extra_config`` is merged into ``quantization_config`` (a caller's own record, such as the
    rotation a QuaRot pass applied). Returns the checkpoint's facts (bytes, modules, overrides)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state, overrides = _packed_state(model, quantized, QuantSpec(bits, group_size, sym))
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if tied and "lm_head" not in quantized:
        state.pop("lm_head.weight", None)  # the builder takes the embedding for a tied head
    config = _config(model, tied and "lm_head" in quantized)
    config["quantization_config"] = {
        "quant_method": "olive",
        "bits": bits,
        "group_size": group_size,
        "symmetric": sym,
        "lm_head": lm_head,
        "embeds": False,
        "desc_act": False,
        "modules_to_not_convert": None,
        "overrides": overrides or None,
        **(extra_config or {}),
    }
    save_file(state, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return {
        "quantized_modules": len(quantized),
        "overrides": len(overrides),
        "weights_bytes": (out / WEIGHTS_FILE).stat().st_size,
    }
