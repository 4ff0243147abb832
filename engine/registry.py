"""Find passes, evaluators, targets and data sources by name.

Built-in plugins are listed here as ``module:Class`` strings and imported only when used, so
listing names costs nothing; third-party plugins register under the entry-point groups
``kiln.passes``, ``kiln.evaluators``, ``kiln.targets`` and ``kiln.datasources``. For a plugin
under development (no package yet), ``KILN_PLUGINS="passes:my_pass=my_module:MyPass,..."`` adds
entries; worker processes inherit it, so such a plugin runs like any other.
"""

from __future__ import annotations

import difflib
import importlib
import os
from functools import cache
from importlib import metadata
from typing import Any

from engine.core.errors import KilnError, MissingDependency

BUILTIN: dict[str, dict[str, str]] = {
    "passes": {
        "torch_export": "passes.export.torch_export:TorchExport",
        "onnx_simplify": "passes.graph.onnx_simplify:OnnxSimplify",
        "onnx_peephole": "passes.graph.onnx_peephole:OnnxPeephole",
        "ort_graph_optimize": "passes.graph.ort_graph_optimize:OrtGraphOptimize",
        "ort_fusion": "passes.graph.ort_fusion:OrtFusion",
        "graph_surgery": "passes.graph.graph_surgery:GraphSurgery",
        "split_model": "passes.graph.split_model:SplitModel",
        "compose_models": "passes.graph.compose_models:ComposeModels",
        "fixed_shape": "passes.graph.fixed_shape:FixedShape",
        "nbits_to_qdq": "passes.quantize.nbits_to_qdq:NbitsToQdq",
        "add_metadata": "passes.graph.add_metadata:AddMetadata",
        "ort_quantize": "passes.quantize.ort_quantize:OrtQuantize",
        "ort_quantize_accuracy": "passes.quantize.ort_quantize_accuracy:OrtQuantizeAccuracy",
        "qnn_quantize": "passes.quantize.qnn_quantize:QnnQuantize",
        "qnn_preprocess": "passes.quantize.qnn_preprocess:QnnPreprocess",
        "int4_weights": "passes.quantize.int4_weights:Int4Weights",
        "mixed_precision": "passes.quantize.mixed_precision:MixedPrecision",
        "inc_quantize": "passes.quantize.inc_quantize:IncQuantize",
        "inc_quantize_accuracy": "passes.quantize.inc_quantize_accuracy:IncQuantizeAccuracy",
        "quark_quantize": "passes.quantize.quark_quantize:QuarkQuantize",
        "fp16": "passes.precision.fp16:Fp16",
        "openvino_convert": "passes.openvino.convert:OpenVinoConvert",
        "nncf_quantize": "passes.openvino.nncf_quantize:NncfQuantize",
        "nncf_quantize_accuracy": "passes.openvino.nncf_quantize_accuracy:NncfQuantizeAccuracy",
        "nncf_compress_weights": "passes.openvino.nncf_compress_weights:NncfCompressWeights",
        "openvino_optimum_convert": "passes.openvino.optimum_convert:OpenVinoOptimumConvert",
        "openvino_io_update": "passes.openvino.io_update:OpenVinoIoUpdate",
        "openvino_encapsulate": "passes.openvino.encapsulate:OpenVinoEncapsulate",
        "ort_serialize": "passes.compile.ort_serialize:OrtSerialize",
        "ort_compile": "passes.compile.ort_compile:OrtCompile",
        "genai_build": "passes.generate.genai_build:GenaiBuild",
        "static_llm": "passes.generate.static_llm:StaticLlm",
        "rtn": "passes.torch_quant.rtn:Rtn",
        "gptq": "passes.torch_quant.gptq:Gptq",
        "decoder_export": "passes.generate.decoder_export:DecoderExport",
        "seq2seq_export": "passes.generate.seq2seq_export:Seq2SeqExport",
        "quarot": "passes.torch_quant.quarot:QuaRot",
        "selective_mixed_precision": "passes.torch_quant.selective_mixed_precision:SelectiveMixedPrecision",
    },
    "evaluators": {
        "latency": "evaluators.latency:Latency",
        "throughput": "evaluators.throughput:Throughput",
        "fidelity": "evaluators.fidelity:Fidelity",
        "accuracy": "evaluators.accuracy:Accuracy",
        "size": "evaluators.size:Size",
        "load": "evaluators.load:Load",
        "memory": "evaluators.memory:Memory",
        "custom": "evaluators.custom:Custom",
        "generation": "evaluators.generation:GenerationEvaluator",
        "perplexity": "evaluators.perplexity:Perplexity",
        "logit_fidelity": "evaluators.logit_fidelity:LogitFidelity",
        "seq2seq_fidelity": "evaluators.seq2seq_fidelity:Seq2SeqFidelity",
        "seq2seq_generation": "evaluators.seq2seq_generation:Seq2SeqGeneration",
    },
    "targets": {
        "onnxruntime": "targets.onnxruntime:OnnxRuntimeTarget",
        "openvino": "targets.openvino:OpenVinoTarget",
        "onnxruntime-genai": "targets.genai:GenaiTarget",
    },
    "datasources": {
        "text_lines": "evaluators.data.text_lines:TextLines",
        "synthetic": "evaluators.data.synthetic:Synthetic",
        "jsonl": "evaluators.data.tabular:JsonLines",
        "csv": "evaluators.data.tabular:Csv",
        "npz": "evaluators.data.npz:Npz",
        "image_folder": "evaluators.data.image_folder:ImageFolder",
        "sklearn": "evaluators.data.sklearn:Sklearn",
        "custom": "evaluators.data.custom:Custom",
        "hf_dataset": "evaluators.data.hf_dataset:HfDataset",
    },
}

KINDS = tuple(BUILTIN)
SINGULAR = {"passes": "pass", "evaluators": "evaluator", "targets": "target", "datasources": "data source"}


class UnknownPlugin(KilnError):
    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        self.kind, self.name, self.known = kind, name, known
        self.suggestion = suggest(name, known)
        extra = f" Did you mean '{self.suggestion}'?" if self.suggestion else ""
        super().__init__(f"no {SINGULAR[kind]} named '{name}'; known: {', '.join(known)}.{extra}")


def suggest(given: str, known: list[str] | tuple[str, ...]) -> str | None:
    """The closest known name, if one is close enough to be a typo."""
    matches = difflib.get_close_matches(str(given), list(known), n=1, cutoff=0.6)
    return matches[0] if matches else None


@cache
def _index(kind: str) -> dict[str, str]:
    index = dict(BUILTIN[kind])
    for entry in metadata.entry_points(group=f"kiln.{kind}"):
        index.setdefault(entry.name, entry.value)
    for item in filter(None, os.environ.get("KILN_PLUGINS", "").split(",")):
        item_kind, _, rest = item.strip().partition(":")
        name, _, target = rest.partition("=")
        if item_kind == kind and name and target:
            index[name] = target
    return index


def names(kind: str) -> list[str]:
    return sorted(_index(kind))


def is_builtin(kind: str, cls: Any) -> bool:
    """Whether ``cls`` is one of Kiln's own plugins of ``kind``: its code ships with Kiln."""
    return f"{cls.__module__}:{cls.__qualname__}" in BUILTIN[kind].values()


@cache
def load(kind: str, name: str) -> Any:
    """The plugin class registered as ``name``; raises ``UnknownPlugin`` with a suggestion."""
    index = _index(kind)
    if name not in index:
        raise UnknownPlugin(kind, name, sorted(index))
    module_name, _, attr = index[name].partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except ModuleNotFoundError as error:
        if (
            error.name
            and not module_name.startswith(error.name)
            and error.name.split(".")[0] not in ("passes", "evaluators", "targets", "engine")
        ):
            raise MissingDependency(error.name, f"the {SINGULAR[kind]} '{name}'") from error
        raise KilnError(f"the {SINGULAR[kind]} '{name}' is registered as {index[name]}, which cannot be imported: {error}") from error
    except AttributeError as error:
        raise KilnError(f"the {SINGULAR[kind]} '{name}' is registered as {index[name]}, which does not exist: {error}") from error
