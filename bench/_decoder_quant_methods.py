"""The methods ``bench/decoder_quant.py`` compares, each ending as the ONNX model Kiln ships: a
``genai`` folder whose Linear layers are MatMulNBits, written by ``genai_build``.

- Weight quantization in PyTorch (``passes.torch_quant``): RTN, GPTQ (with and without act order),
  QuaRot (a random orthogonal rotation seeded per run) before RTN or GPTQ, and selective mixed
  precision (``selective_mixed_precision``'s ``kld_gradient`` scores, Olive's promotion rule: the
  most sensitive units at 8 bits until they hold ``1 - ratio`` of the weights, the rest RTN at 4
  bits). Each writes an Olive checkpoint that ``genai_build`` (``precision: int4``) turns into
  MatMulNBits from the checkpoint's own codes.
- Weight quantization of the FP32 ONNX model (``int4_weights``): k-quant and HQQ.

The language-model head is 4-bit in every method, at the method's group size: the PyTorch
quantizers leave it float (Olive's default) and ``genai_build`` quantizes a checkpoint's float
head with its own round-to-nearest at ``block_size``; ``int4_weights`` quantizes it with the
method. Sizes compare like with like.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the JSON keys the bench writes, in its table's order
KEYS = ("rtn", "gptq", "gptq_act_order", "quarot_rtn", "quarot_gptq", "selective_mixed_precision", "kquant", "hqq")
#: methods whose result depends on a seed (calibration windows and/or the rotation)
SEEDED = ("gptq", "gptq_act_order", "quarot_rtn", "quarot_gptq", "selective_mixed_precision")


@dataclass(frozen=True)
class Method:
    key: str
    kind: str  # "torch" (checkpoint -> genai_build int4) or "onnx" (int4_weights on the FP32 build)
    options: dict[str, Any] = field(default_factory=dict)
    label: str = ""


def methods(group_size: int, mixed_ratio: float) -> dict[str, Method]:
    """The compared methods at 4 bits and ``group_size`` (asymmetric, as Olive writes them), plus
    ``uniform4_small_groups``: RTN at a quarter of the group size (at least 16), the uniform 4-bit
    model about as large as the mixed one (group 32 beside group 128: 4.28 -> 5.13 bits per weight
    with fp32 scales and 4-bit zero points; 20% of the weights at 8 bits: 5.08)."""
    small = max(16, group_size // 4)
    common = {"bits": 4, "group_size": group_size, "sym": False}
    return {
        "rtn": Method("rtn", "torch", {**common, "method": "rtn"}, "RTN"),
        "gptq": Method("gptq", "torch", {**common, "method": "gptq"}, "GPTQ"),
        "gptq_act_order": Method("gptq_act_order", "torch", {**common, "method": "gptq", "desc_act": True}, "GPTQ, act order"),
        "quarot_rtn": Method("quarot_rtn", "torch", {**common, "method": "rtn", "rotate": True}, "QuaRot + RTN"),
        "quarot_gptq": Method("quarot_gptq", "torch", {**common, "method": "gptq", "rotate": True}, "QuaRot + GPTQ"),
        "selective_mixed_precision": Method(
            "selective_mixed_precision",
            "torch",
            {**common, "method": "rtn", "mixed_ratio": mixed_ratio},
            f"selective mixed precision (kld_gradient, ratio {mixed_ratio}) + RTN",
        ),
        "uniform4_small_groups": Method(
            "uniform4_small_groups", "torch", {"bits": 4, "group_size": small, "sym": False, "method": "rtn"}, f"RTN, group {small}"
        ),
        "kquant": Method("kquant", "onnx", {"algorithm": "k_quant", "block_size": group_size}, "k-quant"),
        "hqq": Method("hqq", "onnx", {"algorithm": "hqq", "block_size": group_size}, "HQQ"),
    }


def calibration_windows(stream: Any, count: int, length: int, seed: int) -> list[Any]:
    """``count`` windows of ``length`` tokens of the train split at offsets drawn with ``seed``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - length, (count,), generator=generator).tolist()
    return [stream[s : s + length].long().unsqueeze(0) for s in starts]


def mixed_overrides(model: Any, ratio: float, group_size: int, windows: list[Any]) -> dict[str, dict[str, Any]]:
    """selective_mixed_precision's kld_gradient choice over the decoder layers' Linear modules:
    the most sensitive units (q/k/v together) at 8 bits until they hold ``1 - ratio`` of the weights."""
    from passes.quantize import precision_select as select
    from passes.torch_quant import _sensitivity as sens
    from passes.torch_quant._grid import QuantSpec

    modules = {name: module for name, module in sens.candidates(model).items() if name != "lm_head"}
    units = sens.selection_units(modules)
    low, high = QuantSpec(4, group_size, False), QuantSpec(8, group_size, False)
    scores = sens.kld_scores(sens.kld_alignments(model, list(modules), low, high, windows), units)
    sizes = {key: sum(w.size for w in members) for key, members in units.items()}
    chosen = select.promote(scores, sizes, ratio)
    return {w.node: {"bits": 8} for key in chosen for w in units[key]}


def quantized_checkpoint(model: Any, tok: Any, method: Method, windows: list[Any], seed: int, out: Path) -> Path:
    """A copy of ``model`` quantized by ``method`` (``seed``: the rotation's), as an Olive checkpoint."""
    from passes.torch_quant._checkpoint import write_checkpoint
    from passes.torch_quant._quantize import quantize_linear_layers
    from passes.torch_quant._rotate import rotate_model

    options = dict(method.options)
    work = copy.deepcopy(model)
    overrides = None
    if "mixed_ratio" in options:
        overrides = mixed_overrides(work, options.pop("mixed_ratio"), options["group_size"], windows)
    if options.pop("rotate", False):
        rotate_model(work, seed=seed)
    algorithm = options.pop("method")
    quantized = quantize_linear_layers(
        work, algorithm, **options, overrides=overrides, calibration_batches=windows if algorithm == "gptq" else None
    )
    write_checkpoint(work, tok, out, quantized, bits=options["bits"], group_size=options["group_size"], sym=False, lm_head=False)
    return out


def genai_build(folder: Path, precision: str, out: Path, block_size: int = 32) -> Any:
    """``genai_build`` of a Hugging Face folder (a checkpoint's codes kept as MatMulNBits at int4;
    ``block_size``: the builder's own quantization of what the checkpoint left float, the head)."""
    from engine.core import ModelArtifact, PassContext
    from passes.generate.genai_build import GenaiBuild

    (out / "work").mkdir(parents=True)
    ctx = PassContext(step_id="build", workdir=out / "work", output_dir=out / "model")
    config = (
        GenaiBuild.Config(precision=precision, block_size=block_size) if precision != "fp32" else GenaiBuild.Config(precision=precision)
    )
    return GenaiBuild(config)(ModelArtifact.from_folder("hf", folder), ctx).model


def onnx_weights(fp32: Any, method: Method, out: Path) -> Any:
    """``int4_weights`` on the FP32 build (int8 activations in the dot products, as the builder's int4)."""
    from engine.core import PassContext
    from passes.quantize.int4_weights import Int4Weights

    (out / "work").mkdir(parents=True)
    ctx = PassContext(step_id="weights", workdir=out / "work", output_dir=out / "model")
    config = Int4Weights.Config(**method.options, accuracy_level=4)
    return Int4Weights(config)(fp32, ctx).model


def build_method(model: Any, tok: Any, method: Method, fp32: Any, windows: list[Any], seed: int, out: Path) -> Any:
    if method.kind == "onnx":
        return onnx_weights(fp32, method, out)
    checkpoint = quantized_checkpoint(model, tok, method, windows, seed, out / "checkpoint")
    return genai_build(checkpoint, "int4", out, block_size=method.options["group_size"])


def weight_mb(artifact: Any) -> float:
    """model.onnx and its external data, in MB."""
    return sum(f.stat().st_size for f in Path(artifact.path).iterdir() if f.name.startswith("model.onnx")) / 1e6
