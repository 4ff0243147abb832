"""4-bit block-wise weight-only quantization with onnxruntime's ``MatMulNBitsQuantizer``.

Each constant MatMul weight [K, N] is cut into blocks of ``block_size`` values along K; every
block gets its own scale (and zero point when asymmetric), and the MatMul becomes a
``com.microsoft:MatMulNBits`` that dequantizes on the fly (activations stay float; with
``accuracy_level`` 4 onnxruntime's CPU kernel quantizes them to int8 for the dot products).
Gather (embedding tables) can become ``GatherBlockQuantized``. The output runs on onnxruntime.

Algorithms, all on CPU:

- ``rtn``: round to nearest, onnxruntime's native block quantizer (``DefaultWeightOnlyQuantConfig``).
  MatMul and Gather. No data.
- ``hqq``: Half-Quadratic Quantization (``HQQWeightOnlyQuantConfig``): optimizes scales and zero
  points per block against the weights (uses torch). MatMul only, always asymmetric (float zero
  points). No data.
- ``k_quant``: k-quant (``KQuantWeightOnlyQuantConfig``, llama.cpp's method as Olive's
  ``OnnxKQuantQuantization`` ports it): per block, a weighted least-squares search over 20 scales
  for the scale and minimum, weighting each weight by ``rms(block) + |w|``. MatMul only, always
  asymmetric, 4 or 8 bits. No data.
- ``gptq``: GPTQ (``GPTQWeightOnlyQuantConfig``): corrects the rounding error with second-order
  statistics of the MatMul inputs, computed from the ``calibration`` dataset. MatMul only.

Only MatMuls whose second input is a constant 2-D weight are quantized: attention's
activation x activation MatMuls stay, and so do Gemm nodes and the weights inside fused
Attention / EmbedLayerNormalization nodes (a note says so). Quantizing before ``ort_fusion``
does not help: MatMulNBits no longer matches the attention patterns. On all-MiniLM-L6-v2 (90 MB
of weights) rtn/32 quantizes 36 MatMuls of the unfused export (-> 54.5 MB, cosine 0.970), or
18 of the fused one (-> 63.4 MB, cosine 0.981); with Gather as well the unfused export drops to
14.4 MB (cosine 0.967).

GPTQ goes through onnxruntime's vendored neural-compressor code, which keeps nodes in a dict by
name: unnamed nodes (onnxruntime's fusions leave some) are named first, or all but one would
be dropped; its output is topologically sorted again.

Mixed precision: ``overrides`` gives nodes (by name or shell pattern) other bits (8, or 16 =
float) or another block size, and a plan written into the model by ``mixed_precision`` is
honoured the same way (``passes.quantize.nbits_plan``; the option wins over the plan for a node).

``bits: 8`` (rtn and k_quant) writes MatMulNBits with 8-bit weights instead, for decoders where int4 costs
too much quality. A ``genai`` decoder folder (from genai_build or decoder_export) stays one: the
new model.onnx gets the folder's genai_config.json and tokenizer files beside it.

``matmul_nbits_quantizer`` imports ``onnx_ir`` (the onnx-ir distribution, not declared by
onnxruntime) and calls ``logging.basicConfig`` at import; both are handled here.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, PositiveInt, field_validator, model_validator

from engine.core import Categorical, ModelArtifact, PassConfig, PassContext, PassResult
from engine.core.refs import DatasetRef
from passes.common.graph_tools import add_contrib_opset, name_unnamed_nodes, op_delta, qualified_op_counts, quiet_library, topological_sort
from passes.common.onnx_io import OnnxPass, default_opset, save_onnx
from passes.common.pass_io import onnx_output
from passes.quantize.nbits_plan import NodeOverride, Spec, drop_metadata, metadata_overrides, read_metadata, resolve_specs
from passes.quantize.nbits_run import Setting, quantize, quantize_alone

if TYPE_CHECKING:
    from passes.quantize.calibration import BatchReader

#: GatherBlockQuantized stores int4 tensors, which the default domain has from opset 21
_INT4_OPSET = 21
_QUANTIZED = {"MatMul": "com.microsoft:MatMulNBits", "Gather": "com.microsoft:GatherBlockQuantized"}
#: onnxruntime fused ops that carry weights the MatMulNBits quantizer does not reach
_FUSED_WITH_WEIGHTS = ("com.microsoft:Attention", "com.microsoft:EmbedLayerNormalization", "com.microsoft:MultiHeadAttention")


class Int4Weights(OnnxPass):
    name = "int4_weights"
    summary = "4-bit (or 8-bit, or mixed per node) block-wise weight-only quantization of MatMul (and Gather) weights into MatMulNBits (RTN, HQQ, k-quant or GPTQ)."
    version = "1"
    accepts = ("onnx", "genai")
    produces = "onnx"
    keeps = ("genai",)  # a decoder folder stays one: genai_config.json and the tokenizer are copied
    libraries = ("onnx", "onnxruntime", "onnx-ir", "numpy", "torch")  # torch: hqq computes with it
    search_space = {
        "algorithm": Categorical(("rtn", "hqq", "k_quant")),
        "bits": Categorical((4, 8)),
        "block_size": Categorical((32, 64, 128)),
        "is_symmetric": Categorical((True, False)),
        "accuracy_level": Categorical((None, 4)),
    }
    #: options left out of the job key while at these defaults: configs written before the
    #: option existed keep their keys
    keyless_defaults: ClassVar[dict[str, Any]] = {"bits": 4, "overrides": {}}

    class Config(PassConfig):
        algorithm: Literal["rtn", "hqq", "k_quant", "gptq"] = Field(
            "rtn",
            description="rtn: round to nearest (onnxruntime's native quantizer, MatMul and Gather); hqq: half-quadratic optimization of scales and zero points (MatMul, asymmetric); k_quant: llama.cpp's k-quant weighted least-squares scales and minimums (MatMul, asymmetric, 4 or 8 bits); gptq: error-correcting GPTQ from a calibration dataset (MatMul).",
        )
        bits: Literal[4, 8] = Field(
            4,
            description="Bits per weight: 4 (int4) or 8 (int8, rtn and k_quant: MatMulNBits with 8-bit weights, which onnxruntime's CPU kernel runs). "
            "Left out of the job key when 4, so configs written before the option keep their keys.",
        )
        block_size: Literal[16, 32, 64, 128, 256] = Field(
            32,
            description="Weights per block along the reduction axis K; each block has its own scale. Smaller: more accurate, larger file.",
        )
        is_symmetric: bool = Field(
            True,
            description="Signed int4 with scales only (true) or unsigned int4 with a zero point per block (false). hqq and k_quant are always asymmetric.",
        )
        accuracy_level: Literal[0, 1, 2, 3, 4] | None = Field(
            None,
            description=(
                "MatMulNBits compute type: null/0 unset (the kernel's default), 1 fp32, 2 fp16, 3 bf16, 4 int8 activations "
                "(fastest on CPUs with VNNI, less exact). Not used by hqq."
            ),
        )
        op_types: list[Literal["MatMul", "Gather"]] = Field(
            default_factory=lambda: ["MatMul"],
            min_length=1,
            description="Op types to quantize. Gather (embedding tables -> GatherBlockQuantized) works with rtn only and needs opset >= 21: a lower-opset model is converted to opset 21 first (onnx.version_converter).",
        )
        nodes_to_exclude: list[str] = Field(
            default_factory=list, description="Names of MatMul / Gather nodes to keep in float. An unknown name is an error."
        )
        overrides: dict[str, NodeOverride] = Field(
            default_factory=dict,
            description=(
                "Per-node precision (Olive's customized_weight_config): a node name, or a shell pattern with * ? [ ] "
                '(e.g. "/lm_head/MatMul", "/model/layers.*/mlp/down_proj/MatMul"), mapped to {"bits": 8}, {"bits": 16} (kept float) '
                'and/or {"block_size": 64}. An exact name the model lacks is an error; a pattern matching nothing is noted. Applied over '
                "the plan a mixed_precision step wrote into the model. Left out of the job key when empty."
            ),
        )
        calibration: DatasetRef | None = Field(
            None, description="gptq only: name of the workflow dataset whose samples feed the model to collect the MatMul input statistics."
        )
        calibration_samples: PositiveInt = Field(
            128, description="gptq: at most this many samples of the calibration dataset are used, one per batch."
        )

        @field_validator("op_types", "nodes_to_exclude")
        @classmethod
        def _distinct(cls, names: list[str]) -> list[str]:
            if len(set(names)) != len(names):
                raise ValueError(f"names an entry twice: {names}")
            return sorted(names)

        @model_validator(mode="after")
        def _check(self) -> Int4Weights.Config:
            if self.algorithm == "gptq" and not self.calibration:
                raise ValueError("algorithm gptq needs calibration: the name of a dataset of model inputs")
            if self.algorithm != "gptq" and self.calibration:
                raise ValueError(f"calibration is used by algorithm gptq only; {self.algorithm} needs no data")
            if self.bits == 8 and self.algorithm not in ("rtn", "k_quant"):
                raise ValueError(f"bits 8 works with algorithms rtn and k_quant only, not {self.algorithm}")
            if self.algorithm != "rtn" and "Gather" in self.op_types:
                raise ValueError(f"algorithm {self.algorithm} quantizes MatMul only; Gather needs algorithm rtn")
            return self

    config: Config

    @classmethod
    def resolve_for_target(cls, config: dict[str, Any], target_fingerprint: dict[str, Any] | None) -> dict[str, Any]:
        """``bits`` and ``overrides`` at their defaults are left out of the config the job key names:
        configs written before those options existed keep their keys."""
        return {name: value for name, value in config.items() if cls.keyless_defaults.get(name, ...) != value}

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        # onnx and onnxruntime take seconds to import: load them only when the pass runs (the
        # engine imports pass modules when it validates a workflow)
        import onnx

        from passes.quantize.onnx_facts import initializer_bytes, iter_nodes, node_names

        cfg = self.config
        # the data is read where it is needed: node by node where the quantizer allows (``quantize_alone``)
        source = onnx.load(str(model.model_file), load_external_data=False)
        unknown = sorted(set(cfg.nodes_to_exclude) - node_names(source))
        if unknown:
            raise ValueError(f"nodes_to_exclude: the model has no node named {', '.join(unknown)}")
        counts_in = qualified_op_counts(source)
        bytes_in = initializer_bytes(source)
        candidates = _candidates(source, cfg.op_types)
        named = name_unnamed_nodes(source)  # the gptq code keeps nodes by name: unnamed ones would be lost
        notes: list[str] = []
        source = _gather_opset(source, cfg.op_types, notes)
        reader = self._calibration_reader(source, ctx) if cfg.algorithm == "gptq" else None
        input_order = [t.name for t in source.graph.initializer]  # the quantizers edit ``source`` in place
        plan = read_metadata(source)
        specs = self._node_specs(source, plan, notes)
        drop_metadata(source)  # the plan is consumed here: the output carries what was done, in its ops

        started = time.perf_counter()
        base = Setting(cfg.algorithm, cfg.bits, cfg.block_size, cfg.is_symmetric, cfg.accuracy_level, tuple(cfg.op_types))
        with quiet_library() as messages:
            output, runs = self._quantize(source, model.model_file.parent, base, specs, reader)
        seconds = round(time.perf_counter() - started, 3)
        _order_initializers(output, input_order)
        add_contrib_opset(output)  # the gptq code path writes MatMulNBits without importing the domain
        topological_sort(output)  # ... and leaves the nodes it rewrites out of order
        out_file = save_onnx(output, Path(ctx.output_dir))

        counts_out = qualified_op_counts(output)
        quantized = {op: counts_out.get(new, 0) - counts_in.get(new, 0) for op, new in _QUANTIZED.items() if op in cfg.op_types}
        left = {op: sum(1 for n in iter_nodes(output.graph) if n.op_type == op and n.domain in ("", "ai.onnx")) for op in cfg.op_types}
        notes.extend(self._notes(quantized, candidates, counts_in))
        details: dict[str, Any] = {
            "algorithm": cfg.algorithm,
            "bits": cfg.bits,
            "block_size": cfg.block_size,
            "is_symmetric": cfg.is_symmetric if cfg.algorithm not in ("hqq", "k_quant") else False,
            "accuracy_level": cfg.accuracy_level,
            "op_types": cfg.op_types,
            "candidates": candidates,
            "quantized": quantized,
            "left_float": left,
            "nodes_to_exclude": cfg.nodes_to_exclude,
            **_precision_facts(specs, plan, runs),
            "calibration": cfg.calibration,
            "nodes_named": named,
            **_size_facts(model, counts_in, counts_out, bytes_in, output, out_file),
            "library_warnings": messages,
            "seconds": seconds,
        }
        ctx.logger.debug("int4_weights %s: quantized %s", ctx.step_id, quantized)
        return onnx_output(model, ctx, details, notes)

    def _quantize(
        self, source: Any, base_dir: Path, base: Setting, specs: dict[str, Spec], reader: BatchReader | None
    ) -> tuple[Any, list[dict[str, Any]]]:
        """``quantize``; node by node where the setting is rtn for every node (``quantize_alone``)."""
        import onnx

        cfg = self.config
        candidates = _candidate_names(source, cfg.op_types)
        if cfg.algorithm == "rtn" and not specs:
            output = quantize_alone(source, base_dir, base, candidates, cfg.nodes_to_exclude)
            if output is not None:
                return output, [{"algorithm": "rtn", "bits": cfg.bits, "block_size": cfg.block_size, "nodes": "default"}]
        onnx.load_external_data_for_model(source, str(base_dir))  # the whole model's data, for one run over it
        return quantize(source, base, specs, candidates, cfg.nodes_to_exclude, reader)

    def _node_specs(self, source: Any, plan: dict[str, Any] | None, notes: list[str]) -> dict[str, Spec]:
        """The nodes whose bits or block size differ from the pass's: the model's mixed precision
        plan, then ``overrides``. An unknown exact name in ``overrides`` is an error; one in the
        plan, or a pattern matching nothing, is a note."""
        cfg = self.config
        candidates = _candidate_names(source, cfg.op_types)
        layers = [metadata_overrides(plan), dict(cfg.overrides)]
        specs, unknown, unmatched = resolve_specs(candidates, Spec(cfg.bits, cfg.block_size), layers[1:])
        if unknown:
            raise ValueError(
                f"overrides: the model has no {' / '.join(cfg.op_types)} node with a constant weight named {', '.join(unknown)}"
            )
        if plan is not None:
            specs, unknown, _ = resolve_specs(candidates, Spec(cfg.bits, cfg.block_size), layers)
            if unknown:
                notes.append(
                    f"the model's mixed precision plan names nodes that are not candidates, left as they are: {', '.join(unknown)}"
                )
        if unmatched:
            notes.append(f"overrides: no candidate node matches {', '.join(unmatched)}")
        if cfg.algorithm == "gptq" and any(spec.bits == 8 for spec in specs.values()):
            notes.append("the 8-bit nodes are quantized with rtn: gptq writes 4 bits here")
        if cfg.algorithm == "hqq" and any(spec.bits == 8 for spec in specs.values()):
            notes.append("the 8-bit nodes are quantized with rtn: onnxruntime's CPU kernel does not run hqq's 8-bit output")
        return specs

    def _notes(self, quantized: dict[str, int], candidates: dict[str, int], counts_in: dict[str, int]) -> list[str]:
        cfg = self.config
        notes: list[str] = []
        if not any(quantized.values()):
            notes.append(
                f"nothing was quantized: no {' / '.join(cfg.op_types)} node with a constant 2-D weight "
                f"({sum(candidates.values())} candidates, {len(cfg.nodes_to_exclude)} excluded); the output equals the input"
            )
        if counts_in.get("Gemm"):
            notes.append(f"{counts_in['Gemm']} Gemm nodes stay float: the MatMulNBits quantizer handles MatMul only")
        fused = {op: counts_in[op] for op in _FUSED_WITH_WEIGHTS if counts_in.get(op)}
        if fused:
            listed = ", ".join(f"{n} {op.split(':')[1]}" for op, n in fused.items())
            notes.append(
                f"the weights inside fused ops ({listed}) stay float: the quantizer handles MatMul and Gather nodes only "
                "(quantizing before ort_fusion would keep attention from fusing)"
            )
        return notes

    def _calibration_reader(self, source: Any, ctx: PassContext) -> BatchReader:
        cfg = self.config
        assert cfg.calibration is not None  # the config validator ensures it for gptq
        from passes.quantize.calibration import BatchReader

        dataset = ctx.dataset(cfg.calibration)
        initializers = {t.name for t in source.graph.initializer}
        wanted = [v.name for v in source.graph.input if v.name not in initializers]
        missing = [name for name in wanted if name not in dataset.inputs]
        if missing:
            raise ValueError(
                f"calibration dataset '{cfg.calibration}' lacks model inputs {', '.join(missing)}; it has {', '.join(sorted(dataset.inputs)) or 'none'}"
            )
        if len(dataset) == 0:
            raise ValueError(f"calibration dataset '{cfg.calibration}' is empty")
        batches = [{name: batch[name] for name in wanted} for batch in dataset.batches(1, limit=cfg.calibration_samples)]
        return BatchReader(batches)


def _order_initializers(model: Any, input_order: list[str]) -> None:
    """Put the initializers in a canonical order: the input model's first (in its order), then the
    quantizer's new ones by name. The GPTQ code visits MatMul inputs in set order, which changes
    with the process's hash seed, and appends the quantized weights in that order; without this
    the same input and config would give different bytes in different worker processes."""
    position = {name: index for index, name in enumerate(input_order)}
    model.graph.initializer.sort(key=lambda t: (position.get(t.name, len(position)), t.name))


def _candidates(model: Any, op_types: list[str]) -> dict[str, int]:
    """Nodes of ``op_types`` whose weight (MatMul input 1, Gather input 0) is a float initializer."""
    from passes.quantize.onnx_facts import iter_nodes

    floats = {t.name for t in model.graph.initializer if t.data_type in (1, 10) and len(t.dims) >= 2}
    found = dict.fromkeys(op_types, 0)
    for node in iter_nodes(model.graph):
        if node.domain not in ("", "ai.onnx") or node.op_type not in found:
            continue
        weight = node.input[1] if node.op_type == "MatMul" else node.input[0]
        if weight in floats:
            found[node.op_type] += 1
    return found


def _gather_opset(source: Any, op_types: list[str], notes: list[str]) -> Any:
    """``source`` at opset 21 at least when Gather weights are quantized (int4 tensors)."""
    import onnx

    opset = default_opset(source)
    if "Gather" not in op_types or opset >= _INT4_OPSET:
        return source
    notes.append(
        f"converted the model from opset {opset} to {_INT4_OPSET} (onnx.version_converter): quantized Gather weights are int4 tensors"
    )
    return onnx.version_converter.convert_version(source, _INT4_OPSET)


def _precision_facts(specs: dict[str, Spec], plan: dict[str, Any] | None, runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "node_specs": {name: {"bits": spec.bits, "block_size": spec.block_size} for name, spec in sorted(specs.items())},
        "mixed_precision_plan": plan is not None,
        "quantizer_runs": runs,
    }


def _candidate_names(model: Any, op_types: list[str]) -> list[str]:
    """Names of the main graph's nodes of ``op_types`` whose weight is a float initializer of rank 2+."""
    floats = {t.name for t in model.graph.initializer if t.data_type in (1, 10) and len(t.dims) >= 2}
    names = []
    for node in model.graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type in op_types:
            weight = node.input[1] if node.op_type == "MatMul" else node.input[0]
            if weight in floats and node.name:
                names.append(node.name)
    return sorted(names)


def _size_facts(
    model: ModelArtifact, counts_in: dict[str, int], counts_out: dict[str, int], bytes_in: int, output: Any, out_file: Path
) -> dict[str, Any]:
    from passes.quantize.onnx_facts import file_bytes, initializer_bytes

    return {
        "nodes_before": sum(counts_in.values()),
        "nodes_after": sum(counts_out.values()),
        "op_delta": op_delta(counts_in, counts_out),
        "initializer_bytes_before": bytes_in,
        "initializer_bytes_after": initializer_bytes(output),
        "size_bytes_before": file_bytes(model.model_file),
        "size_bytes_after": file_bytes(out_file),
    }
