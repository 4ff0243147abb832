"""Running onnxruntime's ``MatMulNBitsQuantizer`` for ``int4_weights``, node specs included.

- ``k_quant`` (``passes.quantize.kquant``, numpy) takes per-node bits and block sizes natively,
  as Olive's ``OnnxKQuantQuantization`` does with ``customized_weight_config``: one run.
- ``rtn``, ``hqq`` and ``gptq`` quantize every node with one setting, so a model with per-node
  specs is quantized in turns: the default setting first (the nodes with other specs excluded),
  then one run per other spec over its nodes only. A run touches plain MatMul / Gather nodes
  only, so the nodes quantized by an earlier turn stay as they are. An 8-bit turn of ``hqq`` or
  ``gptq`` uses ``rtn`` (onnxruntime's CPU kernel does not run HQQ's 8-bit output, GPTQ is
  4-bit here; 8-bit round to nearest is within 0.5 % of float).

``matmul_nbits_quantizer`` calls ``logging.basicConfig(level=INFO)`` at import: it is imported
inside ``quiet_library`` by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.core import MissingDependency
from passes.common import node_alone
from passes.quantize.kquant import kquant_model
from passes.quantize.nbits_plan import FLOAT_BITS, Spec, groups

if TYPE_CHECKING:
    from passes.quantize.calibration import BatchReader

#: the bits each algorithm writes itself; other bits go through rtn
_BITS = {"rtn": (4, 8), "k_quant": (4, 8), "hqq": (4,), "gptq": (4,)}


@dataclass(frozen=True)
class Setting:
    """One quantizer run's options."""

    algorithm: str
    bits: int
    block_size: int
    is_symmetric: bool
    accuracy_level: int | None
    op_types: tuple[str, ...]


def quantize(
    source: Any, base: Setting, specs: dict[str, Spec], candidates: list[str], exclude: list[str], reader: BatchReader | None
) -> tuple[Any, list[dict[str, Any]]]:
    """``source`` quantized (in place or anew; the result is returned) with ``base`` for every
    candidate except those in ``exclude`` and those ``specs`` names; those get their spec (bits 16:
    left float). Returns the model and one record per quantizer run."""
    floats = sorted(name for name, spec in specs.items() if spec.bits == FLOAT_BITS)
    excluded = sorted(set(exclude) | set(floats))
    if base.algorithm == "k_quant":
        default = Spec(base.bits, base.block_size)
        chosen = {name: specs.get(name, default) for name in candidates if name not in excluded}
        count = kquant_model(source, chosen, base.accuracy_level)
        return source, [{"algorithm": "k_quant", "bits": base.bits, "block_size": base.block_size, "nodes": "all", "quantized": count}]
    others = {spec: names for spec, names in groups(specs).items() if spec.bits != FLOAT_BITS}
    set_apart = sorted({name for names in others.values() for name in names} | set(excluded))
    model = _run(source, base, set_apart, reader)
    runs: list[dict[str, Any]] = [{"algorithm": base.algorithm, "bits": base.bits, "block_size": base.block_size, "nodes": "default"}]
    for spec, names in others.items():
        algorithm = base.algorithm if spec.bits in _BITS[base.algorithm] else "rtn"
        turn = Setting(algorithm, spec.bits, spec.block_size, base.is_symmetric, base.accuracy_level, base.op_types)
        rest = sorted(set(candidates) - set(names))
        model = _run(model, turn, rest, reader if algorithm == "gptq" else None)
        runs.append({"algorithm": algorithm, "bits": spec.bits, "block_size": spec.block_size, "nodes": names})
    return model, runs


def _run(source: Any, setting: Setting, exclude: list[str], reader: BatchReader | None) -> Any:
    quantizer = make_quantizer(source, setting, exclude, reader)
    quantizer.process()
    return quantizer.model.model


def make_quantizer(source: Any, setting: Setting, exclude: list[str], reader: BatchReader | None) -> Any:
    """The configured MatMulNBitsQuantizer."""
    try:
        from onnxruntime.quantization import matmul_nbits_quantizer as nbits
    except ImportError as error:
        package = "onnx-ir" if "onnx_ir" in str(error) else "onnxruntime"
        raise MissingDependency(package, "the int4_weights pass") from error

    class Quantizer(nbits.MatMulNBitsQuantizer):  # type: ignore[misc, name-defined]
        # The GPTQ path ignores nodes_to_exclude (only the RTN path marks them "fp32" in the node
        # config): mark them here so every path honours the exclusions.
        def _generate_q4_node_config(self) -> dict[str, Any]:
            config: dict[str, Any] = super()._generate_q4_node_config()
            config.update(dict.fromkeys(self.nodes_to_exclude, "fp32"))
            return config

    op_types = setting.op_types
    if setting.algorithm == "hqq":
        algo = nbits.HQQWeightOnlyQuantConfig(block_size=setting.block_size, bits=4, op_types_to_quantize=op_types)
    elif setting.algorithm == "gptq":
        algo = nbits.GPTQWeightOnlyQuantConfig(calibration_data_reader=reader, op_types_to_quantize=op_types)
    else:
        algo = nbits.DefaultWeightOnlyQuantConfig(
            block_size=setting.block_size,
            is_symmetric=setting.is_symmetric,
            accuracy_level=setting.accuracy_level,
            op_types_to_quantize=op_types,
            quant_axes=(("MatMul", 0), ("Gather", 1)),
            bits=setting.bits,
        )
    return Quantizer(
        source,
        bits=setting.bits,
        block_size=setting.block_size,
        is_symmetric=setting.is_symmetric,
        accuracy_level=setting.accuracy_level,
        nodes_to_exclude=list(exclude),
        op_types_to_quantize=op_types,
        algo_config=algo,
    )


def quantize_alone(source: Any, base_dir: Any, setting: Setting, candidates: list[str], exclude: list[str]) -> Any | None:
    """``source`` (loaded without its external data) quantized with ``setting`` (``rtn``: the
    quantizer's DEFAULT, which handles each node on its own) one node at a time, each in a model
    of that node and its weight read from disk, so the float model is never in memory whole: on
    the 0.7 B decoder's 2.8 GB FP32 model the whole-model run peaked at 4.36 GiB (1.66x). The same
    nodes and initializers come out as from one run over the whole model (a test checks the
    bytes). None where that would not hold (a weight read by two nodes or an output, a subgraph):
    the caller then loads the data and runs the quantizer over the whole model."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    graph = source.graph
    if any(attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for node in graph.node for attr in node.attribute):
        return None
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    tensors = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    chosen = set(candidates) - set(exclude)

    def loaded(tensor: Any) -> Any:
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        if uses_external_data(copy):
            load_external_data_for_tensor(copy, str(base_dir))
            copy.data_location = onnx.TensorProto.DEFAULT
            del copy.external_data[:]
        return copy

    nodes: list[Any] = []
    quantized: list[Any] = []
    for node in graph.node:
        weight = (node.input[1] if node.op_type == "MatMul" else node.input[0]) if node.name in chosen else None
        if weight is None:
            nodes.append(node)
            continue
        if readers.get(weight) != 1 or weight in outputs:
            return None
        parts, initializers = node_alone.quantize_alone(
            source, node, loaded(tensors[weight]), lambda single: _run(single, setting, [], None)
        )
        nodes.extend(parts)
        quantized.extend(initializers)
    read = {name for node in nodes for name in node.input} | outputs
    kept = [loaded(t) for t in graph.initializer if t.name in read]
    output = onnx.ModelProto()
    output.CopyFrom(source)  # without external data: the graph's structure, small
    del output.graph.node[:]
    output.graph.node.extend(nodes)
    del output.graph.initializer[:]
    output.graph.initializer.extend(kept + quantized)
    return output
