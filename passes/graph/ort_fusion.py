"""Transformer fusions with onnxruntime's Python optimizer (``onnxruntime.transformers``).

``optimize_model`` first runs onnxruntime's own graph optimizer (``opt_level`` >= 1; levels 0-2
only, never 99: that level bakes hardware-specific kernels into the file), then pattern-matches
subgraphs into onnxruntime contrib ops: Attention / MultiHeadAttention, EmbedLayerNormalization,
SkipLayerNormalization, BiasGelu, FastGelu... The output needs onnxruntime to run.

What fuses depends on how the model was exported. With transformers 5, attention fuses only in a
TorchScript export (``dynamo=False``) of a model loaded with ``attn_implementation="eager"``;
sdpa attention and every dynamo export keep their attention unfused (only the LayerNorm and
Gelu fusions apply). The pass reports what did not fuse and why, or fails on it when told to.

num_heads / hidden_size: taken from the config when given, else from the workflow's input model
when it is a Hugging Face folder (``config.json``: num_attention_heads / n_head / num_heads and
hidden_size / n_embd / d_model), else 0, which lets the optimizer detect them from the graph.
Detection works for bert, t5, swin, unet, vae, clip, sam2 and mmdit; the other model types need
the figures, so the pass fails asking for them. Detection can fail (it did on a 2-head, 32-wide
test BERT): the pass then says so. The job key does not include the input model's digest, so a
config.json edited under an unchanged ONNX file would not re-run this pass.

GPU or CPU: ``use_gpu`` null (the default) takes it from the target the step is planned for:
GPU fusion (onnxruntime's optimizer run with the GPU provider, which keeps float16-friendly
graphs and GPU kernels' fusions) for a CUDA, TensorRT or DirectML target, CPU fusion otherwise.
The job key names {"gpu": true} for a GPU target (``target_facet``) and nothing for a CPU one,
so every CPU target shares one fusion job, keyed as before the pass read its target.

Attention mask: onnxruntime defaults bert to ``mask_index_end`` (the 2D mask is reduced to
sequence lengths), which is wrong for left-padded or holed masks (0.016 max error on a tiny
BERT, 1e-6 with the raw mask); this pass defaults to the raw mask. On all-MiniLM-L6-v2 both
fused 516 -> 46 nodes (6 Attention) and ran at the same speed within noise.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from engine.core import Categorical, ModelArtifact, PassConfig, PassContext, PassResult
from engine.core.refs import InputModelField
from passes.common.graph_tools import add_contrib_opset, name_unnamed_nodes, op_delta, qualified_op_counts, quiet_library
from passes.common.onnx_io import OnnxPass, save_onnx
from passes.common.pass_io import GPU_PROVIDERS, onnx_output, open_onnx_input, ort_target, ort_target_of, require

#: onnxruntime 1.31's optimizer.MODEL_TYPES (checked against the installed library at run time)
ModelType = Literal[
    "bart", "bert", "bert_tf", "bert_keras", "clip", "conformer", "gpt2", "gpt2_tf", "gpt_neox", "phi", "qwen3", "sam2", "swin", "tnlr", "t5", "unet", "vae", "vit", "mmdit"
]  # fmt: skip
#: model types whose fusion detects num_heads and hidden_size from the graph (optimizer.optimize_by_fusion)
_AUTO_DETECTED = ("bert", "t5", "swin", "unet", "vae", "clip", "sam2", "mmdit")
_ATTENTION_OPS = ("Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention", "PackedMultiHeadAttention")
_HEADS_KEYS = ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
#: fusion_options.AttentionMaskFormat values
_MASK_FORMATS = {"mask_index_end": 0, "mask_index_end_and_start": 1, "raw": 2, "no_mask": 3}
_UNFUSED_EXPLANATION = (
    "This usually means the export does not contain the subgraph onnxruntime's fuser matches: with transformers 5 only a "
    "TorchScript export (dynamo=False) of a model loaded with attn_implementation='eager' fuses; sdpa attention and dynamo "
    "exports stay unfused, and so do graphs simplified (onnx_simplify) before fusion. "
    "Fix: export with torch_export config `exporter: torchscript, attn_implementation: eager` and run ort_fusion right after it."
)


class OrtFusion(OnnxPass):
    name = "ort_fusion"
    summary = "Fuse transformer subgraphs (Attention, LayerNorm, Gelu...) into onnxruntime contrib ops with onnxruntime.transformers."
    version = "1"
    accepts = ("onnx",)
    produces = "onnx"
    libraries = ("onnx", "onnxruntime")

    @classmethod
    def warm_modules(cls, input_format: str) -> tuple[str, ...]:
        return (*cls.libraries, "onnxruntime.transformers.optimizer")  # loaded lazily by the library, with its own imports (sympy...)

    search_space = {"opt_level": Categorical((1, 2)), "enable_gelu_approximation": Categorical((False, True))}

    class Config(PassConfig):
        model_type: ModelType = Field(
            "bert",
            description="Which fusion rules to apply (onnxruntime.transformers model types): bert also fits encoder-only models such as MiniLM and RoBERTa; vit for vision transformers; gpt2 for GPT-2-style decoders.",
        )
        num_heads: InputModelField[int | None] = Field(
            None,
            ge=0,
            description="Attention heads. null: read from the input Hugging Face folder's config.json, else 0; 0 = let the optimizer detect it (bert, t5, swin, unet, vae, clip, sam2, mmdit only).",
        )
        hidden_size: InputModelField[int | None] = Field(
            None,
            ge=0,
            description="Hidden size. null: read from the input Hugging Face folder's config.json, else 0 (detected, as for num_heads).",
        )
        opt_level: Literal[0, 1, 2] | None = Field(
            None,
            description=(
                "onnxruntime graph optimization run before the fusions: 0 none, 1 basic, 2 extended. null = the library's "
                "default for the model type (1 for bert, gpt2, vit, ...). Level 99 is not offered: it writes hardware-specific kernels."
            ),
        )
        use_gpu: bool | None = Field(
            None,
            description=(
                "Optimize for a GPU execution provider (only matters with opt_level >= 1, and needs an onnxruntime GPU build). "
                "null = from the target the step is planned for: true for a CUDA, TensorRT or DirectML target, false otherwise. "
                "An explicit true / false wins over the target."
            ),
        )
        only_onnxruntime: bool = Field(
            False, description="Run only onnxruntime's graph optimizer (needs opt_level >= 1), none of the Python fusions."
        )
        disable_attention: bool = Field(False, description="Do not fuse attention.")
        use_multi_head_attention: bool = Field(
            False,
            description="Fuse attention into MultiHeadAttention (separate Q/K/V projections, also cross-attention) instead of Attention (one packed QKV MatMul).",
        )
        disable_embed_layer_norm: bool = Field(False, description="Do not fuse embeddings + LayerNorm into EmbedLayerNormalization.")
        disable_skip_layer_norm: bool = Field(False, description="Do not fuse residual Add + LayerNorm into SkipLayerNormalization.")
        disable_bias_skip_layer_norm: bool = Field(False, description="Do not fold the bias Add into SkipLayerNormalization.")
        disable_layer_norm: bool = Field(False, description="Do not fuse decomposed LayerNorm subgraphs.")
        disable_gelu: bool = Field(False, description="Do not fuse Erf-based Gelu subgraphs.")
        disable_bias_gelu: bool = Field(False, description="Do not fold the bias Add into BiasGelu.")
        enable_gelu_approximation: bool = Field(
            False, description="Replace Gelu / BiasGelu by FastGelu (tanh approximation): faster, not exact: check fidelity."
        )
        attention_mask_format: Literal["raw", "mask_index_end", "mask_index_end_and_start", "no_mask"] | None = Field(
            None,
            description=(
                "How fused Attention reads the attention mask. raw: the 2D mask as given (any padding). mask_index_end: the mask "
                "becomes sequence lengths, correct only for right-padded masks (on a left-padded tiny BERT it differed by 0.016 "
                "where raw differed by 1e-6). null = raw, except no_mask for vit and qwen3 (the library's choice; the library "
                "itself defaults bert to mask_index_end, which this pass does not follow)."
            ),
        )
        disable_shape_inference: bool = Field(False, description="Skip the symbolic shape inference some fusions use.")
        require_attention_fusion: bool = Field(
            False, description="Fail, instead of adding a note, when the model has attention (MatMul + Softmax) and none of it was fused."
        )

        @model_validator(mode="after")
        def _check(self) -> OrtFusion.Config:
            if self.only_onnxruntime and self.opt_level == 0:
                raise ValueError("only_onnxruntime needs opt_level 1 or 2 (with opt_level 0 nothing would run)")
            if self.require_attention_fusion and (self.disable_attention or self.only_onnxruntime):
                raise ValueError("require_attention_fusion contradicts disable_attention / only_onnxruntime")
            return self

    config: Config

    @classmethod
    def target_facet(cls, config: dict[str, Any], target_fingerprint: dict[str, Any] | None) -> dict[str, Any] | None:
        """use_gpu left to the target: {"gpu": true} for a GPU target (and the optimizer's provider
        when it is not CUDA's: DirectML, ROCm, MIGraphX), None for a CPU target (the fusion every
        target got before, keyed as it was). With an explicit use_gpu the facet is None: the config decides."""
        if config.get("use_gpu") is not None:
            return None
        provider = _optimizer_provider(ort_target_of(target_fingerprint))
        if provider is None:
            return None
        return {"gpu": True} if provider == "cuda" else {"gpu": True, "provider": provider}

    @classmethod
    def resolve_for_target(cls, config: dict[str, Any], target_fingerprint: dict[str, Any] | None) -> dict[str, Any]:
        if config.get("use_gpu") is not None:
            return config
        return {**config, "use_gpu": _optimizer_provider(ort_target_of(target_fingerprint)) is not None}

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        # onnx and onnxruntime.transformers (which imports torch at opt_level >= 1) take seconds to
        # import: load them only when the pass runs (the engine imports pass modules to validate)
        optimizer, fusion = require(
            "onnxruntime", self.name, "onnxruntime.transformers.optimizer", "onnxruntime.transformers.fusion_options"
        )
        from passes.quantize.onnx_facts import prune_unused_opsets

        cfg = self.config
        use_gpu, provider = _gpu_choice(cfg.use_gpu, ort_target(ctx))
        opt_level = self._opt_level(optimizer, use_gpu, provider)
        num_heads, hidden_size, source_of_sizes = self._sizes(ctx)
        given = open_onnx_input(model, ctx)
        source, before = given.source, given.graph
        counts_in = qualified_op_counts(before)
        started = time.perf_counter()
        fusion_options = self._fusion_options(fusion.FusionOptions)
        options = {"opt_level": opt_level, "use_gpu": use_gpu, "provider": provider, "only_onnxruntime": cfg.only_onnxruntime}
        with quiet_library() as messages:
            fused = optimizer.optimize_model(
                str(source),
                model_type=cfg.model_type,
                num_heads=num_heads,
                hidden_size=hidden_size,
                optimization_options=fusion_options,
                **options,
            )
            statistics = fused.get_fused_operator_statistics()
        seconds = round(time.perf_counter() - started, 3)

        output = fused.model
        dropped = prune_unused_opsets(output)  # opt_level >= 1 imports every domain onnxruntime knows
        add_contrib_opset(output)  # the fusions write com.microsoft nodes without importing the domain
        named = name_unnamed_nodes(output)  # ... and unnamed Cast nodes (later passes address nodes by name)
        out_file = save_onnx(output, Path(ctx.output_dir))
        counts_out = qualified_op_counts(output)
        attention = self._attention_outcome(counts_in, counts_out, messages)
        notes = self._notes(attention, counts_out)
        details: dict[str, Any] = {
            "model_type": cfg.model_type,
            "num_heads": num_heads,
            "hidden_size": hidden_size,
            "sizes_from": source_of_sizes,
            "opt_level": opt_level,
            "use_gpu": use_gpu,
            "optimizer_provider": provider,
            "only_onnxruntime": cfg.only_onnxruntime,
            "attention_mask_format": {v: k for k, v in _MASK_FORMATS.items()}.get(int(fusion_options.attention_mask_format)),
            # get_fused_operator_statistics() of the output, non-zero entries: counts of the op types the
            # optimizer fuses into, present in the output (LayerNormalization includes the export's own)
            "fused_operators": {op: n for op, n in sorted(statistics.items()) if n},
            "attention": attention,
            **self._graph_facts(before, output, out_file, counts_in, counts_out),
            "dropped_opset_domains": dropped,
            "nodes_named": named,
            "library_warnings": messages,
            "seconds": seconds,
        }
        ctx.logger.debug("ort_fusion %s: fused %s", ctx.step_id, details["fused_operators"])
        return onnx_output(model, ctx, details, notes)

    def _opt_level(self, optimizer: Any, use_gpu: bool, provider: str | None) -> int:
        """The optimizer level to run at, after checking the config against the installed onnxruntime."""
        import onnxruntime

        cfg = self.config
        if cfg.model_type not in optimizer.MODEL_TYPES:
            raise ValueError(
                f"the installed onnxruntime has no optimizer for model_type {cfg.model_type}; it has {', '.join(optimizer.MODEL_TYPES)}"
            )
        opt_level = cfg.opt_level if cfg.opt_level is not None else int(optimizer.MODEL_TYPES[cfg.model_type][2])
        if cfg.only_onnxruntime and opt_level == 0:
            raise ValueError(f"only_onnxruntime needs opt_level 1 or 2; the default for {cfg.model_type} is 0")
        if use_gpu and opt_level >= 1:
            gpu = (
                {name for name, short in GPU_PROVIDERS.items() if short == provider}
                if provider is not None
                else {"CUDAExecutionProvider", "ROCMExecutionProvider", "MIGraphXExecutionProvider"}
            )
            if not gpu & set(onnxruntime.get_available_providers()):
                raise ValueError(
                    "use_gpu needs an onnxruntime build with a GPU execution provider; this one has only "
                    + ", ".join(onnxruntime.get_available_providers())
                )
        return opt_level

    @staticmethod
    def _graph_facts(before: Any, output: Any, out_file: Path, counts_in: dict[str, int], counts_out: dict[str, int]) -> dict[str, Any]:
        from passes.quantize.onnx_facts import file_bytes, initializer_bytes

        return {
            "nodes_before": sum(counts_in.values()),
            "nodes_after": sum(counts_out.values()),
            "op_counts_before": counts_in,
            "op_counts_after": counts_out,
            "op_delta": op_delta(counts_in, counts_out),
            "initializer_bytes_before": initializer_bytes(before),
            "initializer_bytes_after": initializer_bytes(output),
            "size_bytes_after": file_bytes(out_file),
        }

    def _notes(self, attention: dict[str, Any], counts_out: dict[str, int]) -> list[str]:
        cfg = self.config
        notes: list[str] = []
        if attention["unfused"]:
            reason = (
                f"attention was NOT fused: the output still has {attention['softmax_after']} Softmax of MatMul + Softmax attention "
                f"and no new {' / '.join(_ATTENTION_OPS[:2])} node. "
            )
            if attention["heads_not_detected"]:
                reason += "onnxruntime could not detect num_heads / hidden_size: set them in the config. "
            reason += _UNFUSED_EXPLANATION
            if cfg.require_attention_fusion:
                raise ValueError(reason + " (require_attention_fusion is true)")
            notes.append(reason)
        contrib = sorted(op for op in counts_out if op.startswith("com.microsoft:"))
        if contrib:
            notes.append(
                f"the fused model contains onnxruntime contrib ops ({', '.join(c.split(':', 1)[1] for c in contrib)}): it runs on onnxruntime only"
            )
        return notes

    def _sizes(self, ctx: PassContext) -> tuple[int, int, str]:
        """(num_heads, hidden_size, where they came from)."""
        cfg = self.config
        heads, hidden = cfg.num_heads, cfg.hidden_size
        origin = "config"
        if heads is None or hidden is None:
            hf = _hf_config(ctx.input_model)
            if hf is not None:
                found_heads, found_hidden = _first_int(hf, _HEADS_KEYS), _first_int(hf, _HIDDEN_KEYS)
                if (heads is None and found_heads is not None) or (hidden is None and found_hidden is not None):
                    origin = (
                        "input model config.json"
                        if cfg.num_heads is None and cfg.hidden_size is None
                        else "config + input model config.json"
                    )
                heads = found_heads if heads is None else heads
                hidden = found_hidden if hidden is None else hidden
        if heads is None and hidden is None:
            origin = "detected by the optimizer"
        heads, hidden = heads or 0, hidden or 0
        if (heads == 0 or hidden == 0) and cfg.model_type not in _AUTO_DETECTED:
            raise ValueError(
                f"model_type {cfg.model_type} needs num_heads and hidden_size (the optimizer detects them only for "
                f"{', '.join(_AUTO_DETECTED)}); the workflow's input model has no config.json with them: set num_heads and hidden_size"
            )
        return heads, hidden, origin

    def _fusion_options(self, fusion_options_cls: Any) -> Any:
        cfg = self.config
        options = fusion_options_cls(cfg.model_type)
        options.enable_attention = not cfg.disable_attention
        options.use_multi_head_attention = cfg.use_multi_head_attention
        options.enable_embed_layer_norm = options.enable_embed_layer_norm and not cfg.disable_embed_layer_norm
        options.enable_skip_layer_norm = not cfg.disable_skip_layer_norm
        options.enable_bias_skip_layer_norm = not cfg.disable_bias_skip_layer_norm
        options.enable_layer_norm = not cfg.disable_layer_norm
        options.enable_gelu = not cfg.disable_gelu
        options.enable_bias_gelu = not cfg.disable_bias_gelu
        options.enable_gelu_approximation = cfg.enable_gelu_approximation
        options.enable_shape_inference = not cfg.disable_shape_inference
        if cfg.attention_mask_format is not None:
            options.attention_mask_format = _MASK_FORMATS[cfg.attention_mask_format]
        elif options.attention_mask_format in (_MASK_FORMATS["mask_index_end"], _MASK_FORMATS["mask_index_end_and_start"]):
            options.attention_mask_format = _MASK_FORMATS["raw"]  # mask indexes are wrong for left padding
        return options

    def _attention_outcome(self, counts_in: dict[str, int], counts_out: dict[str, int], messages: list[str]) -> dict[str, Any]:
        """What happened to attention. ``unfused`` is the case the pass reports: the input has
        MatMul + Softmax attention, fusion was asked for, and the output has no new attention
        node but still has the Softmax nodes."""

        def attention_ops(counts: dict[str, int]) -> int:
            return sum(n for op, n in counts.items() if op.split(":")[-1] in _ATTENTION_OPS)

        cfg = self.config
        already = attention_ops(counts_in)
        fused = max(attention_ops(counts_out) - already, 0)
        softmax_in, softmax_out = counts_in.get("Softmax", 0), counts_out.get("Softmax", 0)
        in_input = bool(softmax_in and counts_in.get("MatMul"))
        wanted = not (cfg.disable_attention or cfg.only_onnxruntime)
        return {
            "in_input": in_input,
            "fused": fused,
            "unfused": in_input and wanted and fused == 0 and softmax_out > 0,
            "already_fused_in_input": already,
            "softmax_before": softmax_in,
            "softmax_after": softmax_out,
            "heads_not_detected": any("Failed to detect num_heads" in m for m in messages),
        }


def _gpu_choice(use_gpu: bool | None, target: Any) -> tuple[bool, str | None]:
    """(use_gpu, the optimizer's provider). use_gpu null = from the target (the engine resolves it
    when it plans the job; a pass run by hand reads it here); the provider comes from a GPU target,
    else it is the library's default."""
    wanted = use_gpu if use_gpu is not None else _optimizer_provider(target) is not None
    return wanted, (_optimizer_provider(target) if wanted else None)


def _optimizer_provider(target: Any) -> str | None:
    """The provider onnxruntime.transformers' optimizer runs with for a GPU target (its names:
    cuda, dml, rocm, migraphx), None for a CPU target or none. A TensorRT target optimizes with
    CUDA: TensorRT compiles the graph it is given into engines, which an optimized model file
    cannot hold; its CUDA fallback runs the contrib ops the fusions write."""
    gpu = target.gpu_provider if target is not None else None
    if gpu is None:
        return None
    return "cuda" if GPU_PROVIDERS[gpu] == "tensorrt" else GPU_PROVIDERS[gpu]


def _hf_config(input_model: ModelArtifact | None) -> dict[str, Any] | None:
    """The workflow input's config.json, when the input is a Hugging Face folder that has one."""
    if input_model is None or input_model.format != "hf":
        return None
    path = Path(input_model.path) / "config.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else None


def _first_int(config: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
