"""Runs ONNX Runtime GenAI's model builder (``python -m onnxruntime_genai.models.builder``) in
the ``genai_build`` subprocess, with what a folder without tokenizer files needs.

``python _builder_run.py [--no-tokenizer FOLDER] BUILDER-ARGS...``: with ``--no-tokenizer`` the
builder's calls of ``AutoTokenizer.from_pretrained`` on FOLDER get ``NoTokenizer``, which has no
vocabulary, no special tokens and saves nothing, so the token ids in genai_config.json come from
the model's config alone and the output folder holds no tokenizer files. Without it transformers
either fails (no tokenizer files) or, for some model types (Gemma), makes up a tokenizer with an
empty vocabulary whose ``<eos>`` the builder would add to the model's end-of-sequence ids and
whose files it would save beside the model as if they were the model's.

Run as a script by path: of Kiln it imports only ``passes.common.node_alone`` (which imports
nothing else of Kiln), and that only in the lean quantization.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any


class NoTokenizer:
    """Stands for a tokenizer the model does not have: an empty vocabulary and no special tokens."""

    bos_token_id = eos_token_id = pad_token_id = None
    bos_token = eos_token = pad_token = None
    model_max_length = 0

    def get_vocab(self) -> dict[str, int]:
        return {}

    def convert_tokens_to_ids(self, tokens: Any) -> None:
        return None

    def save_pretrained(self, *args: Any, **kwargs: Any) -> tuple[str, ...]:
        print("No tokenizer files in the input folder: none written")
        return ()


def _patch_tokenizer(folder: str) -> None:
    import transformers

    original = transformers.AutoTokenizer.from_pretrained
    target = os.path.realpath(folder)

    def from_pretrained(name: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(name, (str, os.PathLike)) and os.path.realpath(name) == target:
            return NoTokenizer()
        return original(name, *args, **kwargs)

    transformers.AutoTokenizer.from_pretrained = from_pretrained  # type: ignore[method-assign]


def adjust_config(config: Any) -> Any:
    """The config as the builder reads it, where transformers 5 lays it out otherwise (the model
    is the same):

    - Phi-3: the builder picks its LongRoPE class whenever ``max_position_embeddings`` differs
      from ``original_max_position_embeddings`` (4096 unless the config says otherwise), and that
      class reads its caches from longrope parameters only (``KeyError: 'multi_cache'``). With
      any other RoPE type ``original_max_position_embeddings`` changes nothing in the model:
      it is set to ``max_position_embeddings``, which selects the builder's plain Phi-3 class.
    - Gemma 3: transformers 5 keeps one RoPE dict per layer type in ``rope_parameters``
      (``sliding_attention``, ``full_attention``); the builder reads a flat dict (the global
      layers') and ``rope_local_base_freq`` (the sliding layers' theta).
    - A sliding window longer than the context (a config that keeps transformers' default window,
      Gemma 2's 4096, over ``max_position_embeddings`` 512): no position can look further back than
      the context, so a window of the context's length is the same model; the builder would bake
      the longer window into every attention node (``local_window_size``) and ask for a cache that
      long, which GenAI refuses ("max_length (4096) cannot be greater than model context_length (512)").
    """
    window, context = getattr(config, "sliding_window", None), getattr(config, "max_position_embeddings", None)
    if isinstance(window, int) and isinstance(context, int) and 0 < context < window:
        config.sliding_window = context
    rope = getattr(config, "rope_parameters", None)
    if getattr(config, "model_type", None) == "phi3" and isinstance(rope, dict) and rope.get("rope_type") != "longrope":
        config.original_max_position_embeddings = config.max_position_embeddings
    if isinstance(rope, dict) and "full_attention" in rope and "sliding_attention" in rope and "rope_type" not in rope:
        if getattr(config, "model_type", None) in ("gemma3", "gemma3_text"):
            config.rope_local_base_freq = rope["sliding_attention"].get("rope_theta", 10000.0)
            config.rope_parameters = dict(rope["full_attention"])
            config.rope_theta = config.rope_parameters.get("rope_theta", 10000.0)
    return config


def _patch_config() -> None:
    import transformers

    original = transformers.AutoConfig.from_pretrained

    def from_pretrained(*args: Any, **kwargs: Any) -> Any:
        return adjust_config(original(*args, **kwargs))

    transformers.AutoConfig.from_pretrained = from_pretrained  # type: ignore[method-assign]


def _users(builder: Any) -> dict[str, list[Any]]:
    users: dict[str, list[Any]] = {}
    for node in builder.model.graph:
        for value in node.inputs:
            if value is not None:
                users.setdefault(value.name, []).append(node)
    return users


def _to_quantize(builder: Any) -> list[tuple[Any, str]] | None:
    """The nodes ``to_nbits`` quantizes, each with its weight's name, in graph order; None where
    ``lean_to_nbits`` would not make the same model (another algorithm than the quantizer's
    DEFAULT, per-node bit widths, exact overrides, a subgraph, a weight with another user)."""
    if (
        getattr(builder, "quantization_algo", "default") != "default"
        or getattr(builder, "int4_customized_weight_config", None)
        or getattr(builder, "exact_quant_overrides", None)
        or getattr(builder, "exact_quant_override_names", None)
    ):
        return None
    graph, attrs = builder.model.graph, builder.quant_attrs
    outputs = {value.name for value in graph.outputs}
    users = _users(builder)
    chosen: list[tuple[Any, str]] = []
    for node in graph:
        if any(attr.type.name in ("GRAPH", "GRAPHS") for attr in node.attributes.values()):
            return None
        index = 0 if node.op_type == "Gather" else 1
        if node.op_type not in attrs["op_types_to_quantize"] or node.name in attrs["nodes_to_exclude"] or len(node.inputs) <= index:
            continue
        value = node.inputs[index]
        if value is None or value.name not in graph.initializers:
            continue
        if len(users[value.name]) != 1 or value.name in outputs:
            return None
        chosen.append((node, value.name))
    return chosen


def _quantizer_run(attrs: dict[str, Any]) -> Any:
    """Quantizes a model as the builder's ``to_nbits`` quantizes the whole one (its settings)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    from onnxruntime.quantization.quant_utils import QuantFormat

    def run(model: Any) -> Any:
        quantizer = MatMulNBitsQuantizer(
            model=model,
            bits=attrs["bits"],
            block_size=attrs["matmul_block_size"],
            is_symmetric=attrs["is_symmetric"],
            accuracy_level=attrs["accuracy_level"],
            nodes_to_exclude=list(attrs["nodes_to_exclude"]),
            quant_format=QuantFormat.QDQ if attrs["use_qdq"] else QuantFormat.QOperator,
            op_types_to_quantize=tuple(attrs["op_types_to_quantize"]),
            algo_config=None,
        )
        quantizer.process()
        return quantizer.model.model

    return run


def lean_to_nbits(builder: Any, chosen: list[tuple[Any, str]]) -> Any:
    """The builder's ``to_nbits`` (weight-only MatMulNBits through onnxruntime's
    MatMulNBitsQuantizer) without holding the model twice in float.

    The builder turns its whole float graph into one ModelProto (``ir.to_proto``: a copy of every
    weight while the checkpoint's tensors stay in memory) and quantizes that: on a 0.7 B decoder its
    process peaked at 6.7 GiB, 2.56x the fp32 checkpoint. Here the graph goes to a ModelProto
    without its initializers, and each node to quantize is quantized on its own by the same
    quantizer with the same settings, in a model of that node and its float weight
    (``passes.common.node_alone``: the quantizer handles each node on its own, so the same node and
    initializers come out); the IR lets go of each float tensor once it is serialized. The other
    initializers follow, those no node reads left out as the quantizer's clean-up leaves them."""
    import onnx
    import onnx_ir as ir

    from passes.common.node_alone import quantize_alone

    print(f"Quantizing {len(chosen)} nodes one at a time (Kiln's lean to_nbits)", flush=True)
    graph = builder.model.graph
    detached = {name: graph.initializers.pop(name) for name in list(graph.initializers)}
    proto = ir.to_proto(builder.model)  # the graph alone: its initializers follow
    index = {node.name: i for i, node in enumerate(proto.graph.node)}
    replaced: dict[str, list[onnx.NodeProto]] = {}
    quantized: list[onnx.TensorProto] = []

    def serialize(name: str) -> onnx.TensorProto:
        value = detached.pop(name)
        tensor = ir.serde.serialize_tensor(value.const_value)
        value.const_value = None  # the IR lets go of the float tensor
        return tensor

    run = _quantizer_run(builder.quant_attrs)
    for node, weight in chosen:
        replaced[node.name], parts = quantize_alone(proto, proto.graph.node[index[node.name]], serialize(weight), run)
        quantized.extend(parts)
    nodes = [new for old in proto.graph.node for new in replaced.get(old.name, [old])]
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    read = {name for node in nodes for name in node.input} | {output.name for output in proto.graph.output}
    for name in [name for name in detached if name in read]:  # in the quantizer's order: the others, then the quantized
        proto.graph.initializer.append(serialize(name))
    proto.graph.initializer.extend(quantized)
    builder.prepack_matmulnbits_weights(proto)
    return ir.from_proto(proto)


def _patch_lean_quantization() -> None:
    import onnxruntime_genai.models  # noqa: F401 - puts the builder's folder on sys.path, whence it imports ``builders``
    from builders.base import Model  # the module object the builder's classes come from

    original = Model.to_nbits

    def to_nbits(self: Any) -> Any:
        chosen = _to_quantize(self)
        return original(self) if chosen is None else lean_to_nbits(self, chosen)

    Model.to_nbits = to_nbits  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    _patch_config()
    if os.environ.get("KILN_BUILDER_LEAN", "1") != "0":
        _patch_lean_quantization()
    if argv[:1] == ["--no-tokenizer"]:
        _patch_tokenizer(argv[1])
        argv = argv[2:]
    sys.argv = ["onnxruntime_genai.models.builder", *argv]
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
