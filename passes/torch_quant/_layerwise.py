"""GPTQ over a whole decoder, one layer at a time (the paper's section 4 set-up, "Full Algorithm":
"quantize ... layer by layer, feeding the quantized layer's outputs to the next").

1. One forward pass of the float model per calibration batch records what every decoder layer is
   called with besides its hidden states (attention mask, rotary position embeddings, cache
   positions: these differ by layer in models with sliding-window and global layers, such as
   Gemma 2/3), and the hidden states entering the first layer.
2. For each layer in turn, stage by stage (``_stages``: the linears reading the same input, in the
   order the layer calls them: q/k/v, o, gate/up, down in a Llama layer; the reference code's
   ``--true-sequential``): the stage's ``nn.Linear`` inputs are collected over all batches into
   Hessians (``HessianAccumulator``), each of its linears is quantized with
   ``gptq_quantize_weight`` and its weight replaced by the fake-quantized one, so that the next
   stage is calibrated on what the quantized ones give it; then the layer is run again to give
   the next layer its inputs: each layer is calibrated on the outputs of the layers already
   quantized.
3. ``lm_head``, when selected, is calibrated on a last forward pass of the quantized model.

Memory: the model's weights (float32 here: 4 bytes per parameter), one layer's input and output
hidden states for every calibration sample (2 x samples x tokens x hidden x 4 bytes) and the
Hessians of one layer's linears (in_features² x 4 bytes each). For a 7B Llama (hidden 4096,
intermediate 11008) with 128 samples of 2048 tokens: 28 GB of float32 weights (14 GB if kept in
bf16 and converted one layer at a time, which this code does not do), 2 x 4.3 GB of hidden states
and about 0.9 GB of Hessians (six 4096² and one 11008²): about 38 GB of RAM on the CPU, and
hours of compute there; the tiny models of the tests and bench take seconds.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from passes.torch_quant._gptq import HessianAccumulator, gptq_quantize_weight
from passes.torch_quant._grid import QuantSpec, dequantize

if TYPE_CHECKING:
    import torch

Found = tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]


def decoder_layers(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """The name and module list of a causal LM's decoder layers (``model.layers`` for the Llama
    family and its relatives, ``transformer.h`` for GPT-2 style models)."""
    import torch

    for name, module in model.named_modules():
        if name.endswith(("model.layers", "transformer.h", "model.decoder.layers")) and isinstance(module, torch.nn.ModuleList):
            return name, module
    raise ValueError(f"{type(model).__name__} has no decoder layer list (model.layers or transformer.h) to quantize")


class _Call:
    """One recorded call of a decoder layer: its arguments, the hidden states left out."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.positional = bool(args)
        self.args = args[1:] if args else ()
        self.kwargs = {k: v for k, v in kwargs.items() if k not in ("hidden_states", "past_key_values", "past_key_value")}

    def run(self, layer: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        out = layer(hidden, *self.args, **self.kwargs) if self.positional else layer(hidden_states=hidden, **self.kwargs)
        return out[0] if isinstance(out, tuple) else out


def _record(
    model: torch.nn.Module, layers: torch.nn.ModuleList, batches: list[torch.Tensor]
) -> tuple[list[list[_Call]], list[torch.Tensor]]:
    """Every layer's calls (by layer, then batch) and the first layer's hidden states, by batch."""
    calls: list[list[_Call]] = [[] for _ in layers]
    first: list[torch.Tensor] = []

    def hook_for(index: int) -> Any:
        def hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            calls[index].append(_Call(args, kwargs))
            if index == 0:
                first.append((args[0] if args else kwargs["hidden_states"]).detach())

        return hook

    handles = [layer.register_forward_pre_hook(hook_for(index), with_kwargs=True) for index, layer in enumerate(layers)]
    try:
        for batch in batches:
            model(input_ids=batch, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return calls, first


def _hessians(modules: dict[str, torch.nn.Linear], run: Any) -> dict[str, HessianAccumulator]:
    """The Hessians of ``modules``' inputs over what ``run()`` feeds them."""
    found = {name: HessianAccumulator(module.in_features) for name, module in modules.items()}
    handles = [module.register_forward_hook(lambda _m, inputs, _o, acc=found[name]: acc.add(inputs[0])) for name, module in modules.items()]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return found


def _stages(modules: dict[str, torch.nn.Linear], run: Any) -> list[dict[str, torch.nn.Linear]]:
    """``modules`` in the order ``run()`` calls them, in stages of consecutive modules reading the
    same input tensor (q/k/v, then o, then gate/up, then down in a Llama layer); modules it does
    not call come last, in a stage of their own. Quantized stage by stage, each stage's Hessians
    come from the outputs of the stages already quantized (the reference code's
    ``--true-sequential``)."""
    calls: list[tuple[str, Any]] = []

    def hook_for(name: str) -> Any:
        return lambda _m, inputs, _o: calls.append((name, inputs[0]))

    handles = [module.register_forward_hook(hook_for(name)) for name, module in modules.items()]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    stages: list[dict[str, torch.nn.Linear]] = []
    previous = None
    for name, inputs in calls:
        if any(name in stage for stage in stages):
            continue
        if stages and inputs is previous:
            stages[-1][name] = modules[name]
        else:
            stages.append({name: modules[name]})
        previous = inputs
    rest = {name: module for name, module in modules.items() if not any(name in stage for stage in stages)}
    return [*stages, rest] if rest else stages


def _quantize(
    modules: dict[str, torch.nn.Linear], specs: dict[str, QuantSpec], hessians: dict[str, HessianAccumulator], **options: Any
) -> dict[str, Found]:
    done = {}
    for name, module in modules.items():
        codes, scales, zeros = gptq_quantize_weight(module.weight, hessians[name].hessian, specs[name], **options)
        module.weight.data = dequantize(codes, scales, zeros, specs[name]).to(module.weight.dtype)
        done[name] = (codes, scales, zeros)
    return done


def _run_layer(layer: torch.nn.Module, calls: list[_Call], hidden: list[torch.Tensor]) -> list[torch.Tensor]:
    return [call.run(layer, h) for call, h in zip(calls, hidden, strict=True)]


def _run_model(model: torch.nn.Module, batches: list[torch.Tensor]) -> None:
    for batch in batches:
        model(input_ids=batch, use_cache=False)


def gptq_layerwise(
    model: torch.nn.Module,
    modules: dict[str, torch.nn.Linear],
    specs: dict[str, QuantSpec],
    batches: list[torch.Tensor],
    *,
    damp_percent: float,
    desc_act: bool,
    block_size: int,
) -> dict[str, Found]:
    """GPTQ of ``modules`` (names of ``model``), layer by layer; weights replaced in place by their
    fake-quantized values. Returns ``(codes, scales, zeros)`` by name."""
    import torch

    options = {"damp_percent": damp_percent, "desc_act": desc_act, "block_size": block_size}
    prefix, layers = decoder_layers(model)
    done: dict[str, Found] = {}
    with torch.no_grad():
        calls, hidden = _record(model, layers, batches)
        for index, layer in enumerate(layers):
            own = {name: module for name, module in modules.items() if name.startswith(f"{prefix}.{index}.")}
            run = partial(_run_layer, layer, calls[index], hidden)
            for stage in _stages(own, partial(_run_layer, layer, calls[index][:1], hidden[:1])) if own else []:
                done.update(_quantize(stage, specs, _hessians(stage, run), **options))
            hidden = _run_layer(layer, calls[index], hidden)
        calls.clear()
        if "lm_head" in modules:
            head = {"lm_head": modules["lm_head"]}
            hessians = _hessians(head, partial(_run_model, model, batches))
            done.update(_quantize(head, specs, hessians, **options))
    return done
