"""Reading the input of the PyTorch quantizers: a float Hugging Face decoder, or one already
quantized in the ``olive`` checkpoint format (``passes.torch_quant._checkpoint``), as a
``gptq`` step leaves it for a following ``rtn`` (Olive's ``allow_quantized``).

An olive input is loaded as the float model of its config (without ``quantization_config``),
each quantized module's weight being its dequantized codes ``(codes - zero) * scale``, so that a
later pass, and its calibration forward passes, see the function of the quantized model. The
modules found quantized come back with their exact codes, scales, zero points and spec (a fused
projection, written split by the checkpoint writer, is put together again), for the writer to
store them unchanged.

A ``quantization_config`` of any other method (gptq, awq, bitsandbytes, ...) is refused by name:
transformers would either need that method's kernels or, for a method it does not know, load the
float modules and leave the quantized ones at random. Loading fails too when transformers reports
a weight missing from the checkpoint, naming it: random weights are never quantized.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from passes.torch_quant._checkpoint import _split_rows
from passes.torch_quant._grid import QuantSpec, unpack

if TYPE_CHECKING:
    import torch

    from passes.torch_quant._quantize import QuantizedLinear

OLIVE = "olive"
# the keys write_checkpoint sets itself; any other key of an input's quantization_config is kept
STANDARD_KEYS = ("quant_method", "bits", "group_size", "symmetric", "sym", "lm_head", "embeds", "desc_act")
STANDARD_KEYS += ("modules_to_not_convert", "overrides")
PACKED = (".qweight", ".scales", ".qzeros", ".g_idx")


@dataclass
class DecoderInput:
    """A loaded decoder (float32, eval mode), its tokenizer (None when it has none), the modules
    of an olive input already quantized, by name, and that input's ``quantization_config``
    (empty for a float input)."""

    model: torch.nn.Module
    tokenizer: Any
    quantized: dict[str, QuantizedLinear] = field(default_factory=dict)
    quant_config: dict[str, Any] = field(default_factory=dict)

    def checkpoint_defaults(self, bits: int, group_size: int, sym: bool, lm_head: bool) -> dict[str, Any]:
        """``write_checkpoint``'s defaults: the step's own for a float input; for an olive input
        its own defaults (the kept modules keep their overrides), the lm_head flag of either, and
        the input's other ``quantization_config`` keys."""
        qc = self.quant_config
        if not qc:
            return {"bits": bits, "group_size": group_size, "sym": sym, "lm_head": lm_head}
        extra = {k: v for k, v in qc.items() if k not in STANDARD_KEYS}
        return {
            "bits": int(qc["bits"]),
            "group_size": int(qc["group_size"]),
            "sym": _sym(qc),
            "lm_head": bool(qc.get("lm_head")) or lm_head,
            "extra_config": extra or None,
        }


def _sym(values: dict[str, Any], default: bool = False) -> bool:
    return bool(values.get("symmetric", values.get("sym", default)))


def input_quantization(folder: Path) -> dict[str, Any]:
    """The ``quantization_config`` of a Hugging Face folder's config.json: empty for a float
    model; refuses a method other than olive, naming it."""
    config = json.loads((Path(folder) / "config.json").read_text())
    qc = config.get("quantization_config") or {}
    if not qc:
        return {}
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if method != OLIVE:
        raise ValueError(
            f"{folder} is a checkpoint quantized with quant_method {method!r}: the PyTorch quantizers read a float model or an "
            f"olive-format checkpoint (the output of rtn, gptq or quarot); give them the float model"
        )
    for key in ("bits", "group_size"):
        if key not in qc:
            raise ValueError(f"{folder}/config.json: the olive quantization_config has no {key}")
    return dict(qc)


def refuse_quantized(folder: Path, who: str, why: str) -> None:
    """Refuse an input that is already quantized (any method) for the pass ``who``, saying ``why``."""
    if input_quantization(folder):
        raise ValueError(f"{who} needs a float model and {folder} is already quantized (an olive checkpoint): {why}")


def load_input(folder: Path, who: str, allow_quantized: bool = False) -> DecoderInput:
    """The decoder of ``folder`` (see the module docstring); an olive input only when
    ``allow_quantized``, else refused for the pass ``who``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    qc = input_quantization(folder)
    if qc and not allow_quantized:
        raise ValueError(f"{who} needs a float model and {folder} is already quantized (an olive checkpoint)")
    options: dict[str, Any] = {"dtype": torch.float32, "output_loading_info": True}
    quantized: dict[str, QuantizedLinear] = {}
    if qc:
        cls, config, state, quantized = _olive_state(folder, qc)
        model, info = cls.from_pretrained(None, config=config, state_dict=state, **options)
    else:
        model, info = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, **options)
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:12]) + (f" and {len(missing) - 12} more" if len(missing) > 12 else "")
        raise ValueError(
            f"{folder}: the checkpoint lacks {len(missing)} weight(s) of the model ({shown}); refusing to quantize random weights"
        )
    left = sorted(k for k in info.get("unexpected_keys") or () if k.endswith(PACKED))
    if left:
        raise ValueError(f"{folder}: quantized tensors that match no linear module of the model: {', '.join(left[:12])}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError):
        tokenizer = None
    return DecoderInput(model.eval(), tokenizer, quantized, qc)


def _olive_state(folder: Path, qc: dict[str, Any]) -> tuple[Any, Any, dict[str, torch.Tensor], dict[str, QuantizedLinear]]:
    """The model's class, its config without ``quantization_config``, the float state dict (quantized modules
    dequantized, fused ones put together) and the quantized modules."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    linears = {name: m for name, m in skeleton.named_modules() if isinstance(m, torch.nn.Linear)}
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder}: an olive checkpoint without safetensors files")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    parts = {key[: -len(".qweight")] for key in state if key.endswith(".qweight")}
    quantized: dict[str, QuantizedLinear] = {}
    for name, module in linears.items():
        pieces = [(part, first, end) for part, first, end in _split_rows(name, config, module.out_features) if part in parts]
        if not pieces:
            continue
        items = [_read(part, state, qc, module.in_features) for part, _, _ in pieces]
        rows = [item.codes.shape[0] for item in items]
        if rows != [end - first for _, first, end in pieces] or sum(rows) != module.out_features:
            raise ValueError(f"{folder}: the quantized parts of {name} do not make its {module.out_features} output rows")
        quantized[name] = _joined(name, items)
        biases = [state.pop(f"{part}.bias") for part, _, _ in pieces if f"{part}.bias" in state]
        if biases:
            state[f"{name}.bias"] = torch.cat(biases) if len(biases) > 1 else biases[0]
        state[f"{name}.weight"] = quantized[name].dequantized()
        parts -= {part for part, _, _ in pieces}
    if parts:
        raise ValueError(f"{folder}: quantized tensors that match no linear module of the model: {', '.join(sorted(parts)[:12])}")
    return type(skeleton), config, state, quantized


def _read(name: str, state: dict[str, torch.Tensor], qc: dict[str, Any], in_features: int) -> QuantizedLinear:
    """Module ``name``'s codes, scales and zero points, popped from ``state``, with its spec
    (the config's defaults, updated by its override)."""
    import torch

    from passes.torch_quant._quantize import QuantizedLinear

    own = (qc.get("overrides") or {}).get(name) or {}
    spec = QuantSpec(
        bits=int(own.get("bits", qc["bits"])),
        group_size=int(own.get("group_size", qc["group_size"])),
        sym=_sym(own, _sym(qc)),
    )
    if spec.bits not in (4, 8):
        raise ValueError(f"{name}: bits {spec.bits} in the input checkpoint is not supported (4 or 8)")
    if f"{name}.g_idx" in state:
        raise ValueError(f"{name}: the input checkpoint has a g_idx (act order without static groups), which is not supported")
    groups = spec.groups(in_features)
    codes = unpack(state.pop(f"{name}.qweight"), spec.bits, in_features)
    scales = state.pop(f"{name}.scales").to(torch.float32).reshape(codes.shape[0], groups)
    packed_zeros = state.pop(f"{name}.qzeros", None)
    if packed_zeros is None:
        if not spec.sym:
            raise ValueError(f"{name}: asymmetric in the input checkpoint's config, but it has no qzeros")
        zeros = torch.full((codes.shape[0], groups), (spec.maxq + 1) // 2, dtype=torch.int32)
    else:
        zeros = unpack(packed_zeros, spec.bits, groups).to(torch.int32)
    return QuantizedLinear(spec, codes, scales, zeros)


def _joined(name: str, items: list[QuantizedLinear]) -> QuantizedLinear:
    """One quantized module from the parts of a fused projection, stacked along the output rows."""
    import torch

    from passes.torch_quant._quantize import QuantizedLinear

    if len(items) == 1:
        return items[0]
    if len({item.spec for item in items}) > 1:
        raise ValueError(f"{name}: the parts of this fused projection are quantized with different bits or groups in the input")
    return QuantizedLinear(
        items[0].spec,
        torch.cat([i.codes for i in items]),
        torch.cat([i.scales for i in items]),
        torch.cat([i.zeros for i in items]),
    )
