"""Build a decoder with a key/value cache with ONNX Runtime GenAI's model builder
(``onnxruntime_genai.models.builder``): a Hugging Face causal LM folder (Llama, Qwen, Mistral,
Phi, GPT-2 families and more) becomes a ``genai`` folder (model.onnx + external data,
genai_config.json, the tokenizer's files) with the builder's fused kernels (GroupQueryAttention,
SkipSimplifiedLayerNormalization, rotary embeddings) at fp32, fp16, bf16, int8 or int4 weights
(MatMulNBits, quantized while the model is written).

The input is a Hugging Face folder (``hf``: config.json, weights, tokenizer) or a ``torch``
factory whose function returns ``(PreTrainedModel, tokenizer)``; both are saved with
``save_pretrained`` into the step's workdir first (see ``passes.generate._common``).

The builder prints and draws progress bars: it runs as a subprocess
(``onnxruntime_genai.models.builder`` through ``_builder_run.py``, which hands it the config as it
reads it: Phi-3 without longrope, Gemma 3's per-layer-type RoPE; and, for a folder without
tokenizer files, no tokenizer instead of a failure or a made-up one) whose output goes to ``builder.log`` in the
step's workdir, with its cache folder there too. It reads the local folder only (Hugging Face
offline mode, no token). It runs with ``GIT_DIR`` pointing at no repository: the builder stamps
the model's ``producer_version`` with the commit ``git rev-parse HEAD`` gives in the folder five
levels above its own files, which for an environment inside a git checkout (``.venv/lib`` of a
project) is the checkout's current commit, so the model's bytes changed with every commit made
there; without git it stamps the wheel's own commit (``onnxruntime_genai.__commit__``).

The options are the builder's (``precision``, ``block_size``, ``accuracy_level``, ``is_symmetric``,
``algo_config``, ``op_types_to_quantize``), under the builder's names; the quantization options
apply to int4 and int8 only.

The execution provider (``cpu``, ``cuda``, ``dml``) decides the kernels and the input/output
types; null takes it from the target: ``cuda`` for an onnxruntime target on a CUDA (or
TensorRT) GPU or an onnxruntime-genai target with device cuda, else ``cpu`` (whose job keys
name no target). fp16 and bf16 on ``cpu`` are refused: the builder writes them, but ONNX
Runtime's CPU provider cannot run the result (GroupQueryAttention has no float16 CPU kernel,
the inserted casts fail at run time). fp32 on ``cuda`` is refused too: ONNX Runtime GenAI 0.18's
builder writes it with packed ``Attention`` nodes that produce no present key/values, a graph
onnxruntime refuses to open ("Graph output (present.0.key) does not exist in the graph"), and its
CPU graph is no way round: its fp32 GroupQueryAttention has no CUDA kernel (the builder itself
allows GroupQueryAttention on CUDA in fp16 and bf16 only), so it would run on the CPU. fp16 is the
GPU reference. Whatever the builder writes gets the loadability check candidates get before the
pass reports success (``GenaiPass.check_output``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from engine.core import Categorical, ModelArtifact, PassConfig, PassContext, PassResult
from engine.core.model_kind import read_config
from passes.generate._common import GenaiPass, decoder_facts, execution_provider_of, has_tokenizer, hf_input

Precision = Literal["fp32", "fp16", "bf16", "int8", "int4"]
Provider = Literal["cpu", "cuda", "dml"]
_QUANTIZED = ("int4", "int8")
_QUANTIZATION_OPTIONS = ("block_size", "accuracy_level", "is_symmetric", "algo_config", "op_types_to_quantize")
_LOG_TAIL = 20


class GenaiBuild(GenaiPass):
    name = "genai_build"
    summary = (
        "Build a KV-cache decoder (genai folder: model.onnx, genai_config.json, tokenizer) from a Hugging Face causal LM "
        "with ONNX Runtime GenAI's model builder, at fp32 / fp16 / bf16 / int8 / int4 weights."
    )
    version = "1"
    model_kinds = ("decoder",)
    accepts = ("hf", "torch")
    produces = "genai"
    libraries = ("onnxruntime-genai", "onnx", "transformers", "torch")
    search_space = {"precision": Categorical(("fp32", "int4")), "block_size": Categorical((32, 64, 128))}
    default_timeout_s = 7200.0

    class Config(PassConfig):
        precision: Precision = Field(
            "fp32",
            description="Weights (and compute) of the built model: fp32, fp16 / bf16 (GPU providers only), "
            "int8 or int4 (weight-only MatMulNBits, activations float).",
        )
        execution_provider: Provider | None = Field(
            None,
            description="The provider the model is built for (kernels, I/O types). null = from the target: cuda for a CUDA GPU target "
            "(onnxruntime with a CUDA/TensorRT provider, or onnxruntime-genai with device cuda), dml for DirectML, else cpu.",
        )
        block_size: Literal[16, 32, 64, 128, 256] = Field(
            32, description="int4/int8: weights per quantization block along K (the builder's block_size)."
        )
        accuracy_level: Literal[1, 2, 3, 4] | None = Field(
            None,
            description="int4/int8: MatMulNBits compute type, 1 fp32, 2 fp16, 3 bf16, 4 int8 activations. "
            "null = the builder's default (4 on cpu, unset elsewhere).",
        )
        is_symmetric: bool = Field(True, description="int4/int8: signed weights with scales only (true) or unsigned with zero points.")
        algo_config: Literal["default", "rtn", "k_quant"] = Field(
            "default",
            description="int4/int8: the quantization algorithm: default (MatMulNBitsQuantizer's own round-to-nearest), rtn, or k_quant "
            "(llama.cpp-style k-quants).",
        )
        op_types_to_quantize: list[Literal["MatMul", "Gather"]] = Field(
            default_factory=lambda: ["MatMul"],
            min_length=1,
            description="int4/int8: op types quantized; Gather adds the embedding table (GatherBlockQuantized).",
        )

        @field_validator("op_types_to_quantize")
        @classmethod
        def _distinct(cls, names: list[str]) -> list[str]:
            if len(set(names)) != len(names):
                raise ValueError(f"names an entry twice: {names}")
            return sorted(names)

    config: Config

    @classmethod
    def target_facet(cls, config: dict[str, Any], target_fingerprint: dict[str, Any] | None) -> dict[str, Any] | None:
        """The provider the target asks for when execution_provider is null and it is not the CPU."""
        if config.get("execution_provider") is not None:
            return None
        provider = execution_provider_of(target_fingerprint)
        return None if provider == "cpu" else {"execution_provider": provider}

    @classmethod
    def resolve_for_target(cls, config: dict[str, Any], target_fingerprint: dict[str, Any] | None) -> dict[str, Any]:
        """execution_provider null set from the target; for a float precision the quantization
        options, which change nothing then, set to their defaults, so that a search over block
        sizes builds each float model once."""
        if config.get("precision", "fp32") not in _QUANTIZED:
            defaults = cls.Config().to_json()
            config = {**config, **{name: defaults[name] for name in _QUANTIZATION_OPTIONS if name in config}}
        if config.get("execution_provider") is not None:
            return config
        return {**config, "execution_provider": execution_provider_of(target_fingerprint)}

    @classmethod
    def config_refusal(cls, config: dict[str, Any]) -> tuple[str, str, str, str] | None:
        """What the builder cannot build, read from config.json at validate time: a Phi-3 with
        longrope whose max_position_embeddings equals original_max_position_embeddings (the builder
        takes it for a short model, whose class fails: "The longrope RoPE style is not currently
        supported")."""
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        kind = rope.get("rope_type") or rope.get("type") if isinstance(rope, dict) else None
        longest, original = config.get("max_position_embeddings"), config.get("original_max_position_embeddings", 4096)
        if config.get("model_type") != "phi3" or kind != "longrope" or longest != original:
            return None
        return (
            "max_position_embeddings",
            f"longrope with max_position_embeddings equal to original_max_position_embeddings ({longest}): ONNX Runtime GenAI's "
            "model builder then picks its short Phi-3 class, which fails ('The longrope RoPE style is not currently supported')",
            "max_position_embeddings above original_max_position_embeddings for longrope, or no longrope",
            "give config.json the context the long factors are for (max_position_embeddings above original_max_position_embeddings)",
        )

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        cfg = self.config
        provider = cfg.execution_provider or "cpu"
        self._refuse_unbuildable(provider)
        workdir = Path(ctx.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        source, notes = hf_input(model, ctx, self.name)
        out = Path(ctx.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        refusal = self.config_refusal(read_config(source) or {})
        if refusal is not None:
            raise ValueError(f"{source / 'config.json'}: {refusal[0]}: {refusal[1]}; {refusal[3]}")
        extra = self._extra_options()
        tokenizer = has_tokenizer(source)
        if not tokenizer:
            notes.append("the input has no tokenizer files: none written; genai_config.json's token ids are the model config's")
        command = [
            sys.executable,
            str(Path(__file__).with_name("_builder_run.py")),
            *([] if tokenizer else ["--no-tokenizer", str(source)]),
            "-i",
            str(source),
            "-o",
            str(out),
            "-p",
            cfg.precision,
            "-e",
            provider,
            "-c",
            str(workdir / "builder_cache"),
            "--extra_options",
            *extra,
        ]
        log = workdir / "builder.log"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "GIT_DIR": os.devnull}
        started = time.perf_counter()
        with log.open("w") as handle:
            done = subprocess.run(
                command, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=workdir, check=False
            )
        seconds = round(time.perf_counter() - started, 3)
        ctx.logger.debug("genai_build %s: builder exited %d after %.1f s (log %s)", ctx.step_id, done.returncode, seconds, log)
        if done.returncode != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-_LOG_TAIL:]
            raise ValueError(f"the model builder failed (exit {done.returncode}); the end of its log:\n" + "\n".join(tail))
        facts = decoder_facts(out)
        details: dict[str, Any] = {
            "precision": cfg.precision,
            "execution_provider": provider,
            "extra_options": extra,
            **facts,
            "seconds": seconds,
        }
        attrs = {"inputs": facts["inputs"], "outputs": facts["outputs"], **({"tokenizer": str(out)} if tokenizer else {})}
        return PassResult(model=ModelArtifact.from_folder("genai", out, attrs=attrs), details=details, notes=notes)

    def _refuse_unbuildable(self, provider: str) -> None:
        """Raise for a precision the builder writes for ``provider`` but onnxruntime cannot run there."""
        cfg = self.config
        if provider == "cpu" and cfg.precision in ("fp16", "bf16"):
            raise ValueError(
                f"precision {cfg.precision} is not built for the cpu execution provider: ONNX Runtime's CPU kernels cannot run it "
                "(no float16 GroupQueryAttention); use fp32, int8 or int4 on a CPU, or a GPU target / execution_provider cuda"
            )
        if provider == "cuda" and cfg.precision == "fp32":
            raise ValueError(
                "precision fp32 is not built for the cuda execution provider: ONNX Runtime GenAI's model builder writes an fp32 CUDA "
                "decoder whose Attention nodes produce no present key/values, which onnxruntime refuses to open ('Graph output "
                "(present.0.key) does not exist in the graph'), and its fp32 CPU graph's GroupQueryAttention has no CUDA kernel; "
                "use precision fp16 (the GPU reference) or bf16, int8 or int4 for a GPU target"
            )

    def _extra_options(self) -> list[str]:
        """The builder's KEY=VALUE extra options for this config (offline: no Hugging Face token)."""
        cfg = self.config
        options = ["hf_token=false"]
        if cfg.precision in _QUANTIZED:
            options += [
                f"block_size={cfg.block_size}",
                f"is_symmetric={str(cfg.is_symmetric).lower()}",
                f"algo_config={cfg.algo_config}",
                "op_types_to_quantize=" + "/".join(cfg.op_types_to_quantize),
            ]
            if cfg.accuracy_level is not None:
                options.append(f"accuracy_level={cfg.accuracy_level}")
        return options
