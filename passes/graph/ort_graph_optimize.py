"""onnxruntime's own graph optimizer, run offline: the optimized graph is saved as the new model.

onnxruntime optimizes every model when it opens a session; saving the result
(``SessionOptions.optimized_model_filepath``) moves that work out of the session start and lets
later passes (quantization) see the optimized graph. Levels:

- ``basic``: semantics-preserving rewrites with standard ops only (constant folding, redundant
  node elimination, Conv+Add/Mul/BN folding...). The output is plain ONNX.
- ``extended`` (default): adds fusions into onnxruntime's contrib ops (com.microsoft:
  FusedMatMul, BiasGelu, SkipLayerNormalization, Attention on some graphs...). The output
  loads only in onnxruntime (other runtimes may not know those ops).

Higher levels (``layout``, ``all``) are not offered: above EXTENDED onnxruntime bakes in
layout transforms and kernels chosen for the CPU that optimizes (NCHWc blocking for its vector
width), and warns that the saved model "should only be used in the same environment the model
was optimized in". A portable artifact must stop at EXTENDED; the session that loads the model
applies the higher levels on the machine that runs it anyway.

Providers: ``basic`` rewrites are the same for every execution provider, so that level runs on
the CPU provider and one job serves every target. ``extended`` fusions are provider-specific
(onnxruntime fuses a node only for the providers its fused kernel exists for), so above basic the
pass optimizes with the providers of the target it is planned for, and the job key names them
(``target_facet``: {"providers": [...]}); a CPU target keys as before, with none. Providers that
compile the graph they are given (TensorRT, OpenVINO, QNN, CoreML, DirectML...) cannot have
their result saved as a model: they are left out and their target optimizes with the providers
that remain (a TensorRT target: CUDA's fusions, which its CUDA fallback runs). A provider this
onnxruntime lacks fails the pass: onnxruntime would optimize for the CPU instead, silently.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from engine.core import Categorical, ModelArtifact, PassConfig, PassContext, PassResult
from passes.common.graph_tools import contrib_ops, op_delta, qualified_op_counts, quiet_library
from passes.common.onnx_io import EXTERNAL_DATA_THRESHOLD, OnnxPass, save_onnx
from passes.common.pass_io import CPU_PROVIDER, OrtTarget, onnx_output, open_onnx_input, ort_target, ort_target_of, require

#: the file onnxruntime writes the optimized model to, inside the step's workdir
_OPTIMIZED_FILE = "optimized.onnx"
_OPTIMIZED_DATA = "optimized.onnx.data"
#: execution providers whose optimized graph onnxruntime can save as a model (kernel providers;
#: the others compile subgraphs into nodes a model file cannot hold: TensorRT, OpenVINO, QNN,
#: CoreML, MIGraphX, and DirectML, which fuses its partitions into compiled nodes)
_SAVABLE_PROVIDERS = ("CUDAExecutionProvider", "ROCMExecutionProvider", CPU_PROVIDER)


def _optimizing_providers(target: OrtTarget | None, level: str) -> list[str] | None:
    """The providers a level above basic optimizes with for ``target``, in the target's order and
    ending in the CPU's (onnxruntime adds it anyway); None: the CPU provider alone."""
    if target is None or level == "basic":
        return None
    kept = [name for name in target.providers if name in _SAVABLE_PROVIDERS and name != CPU_PROVIDER]
    return [*kept, CPU_PROVIDER] if kept else None


class OrtGraphOptimize(OnnxPass):
    name = "ort_graph_optimize"
    summary = "Run onnxruntime's graph optimizer offline (basic or extended level) and save the optimized graph as the model."
    version = "1"
    accepts = ("onnx",)
    produces = "onnx"
    libraries = ("onnx", "onnxruntime")
    search_space = {"level": Categorical(("basic", "extended"))}

    class Config(PassConfig):
        level: Literal["basic", "extended"] = Field(
            "extended",
            description=(
                "onnxruntime graph optimization level. basic: standard-op rewrites only (constant folding, redundant nodes, "
                "Conv+BN...); the output stays plain ONNX. extended: also fuses into com.microsoft contrib ops (FusedMatMul, "
                "BiasGelu, SkipLayerNormalization...); the output then needs onnxruntime. Levels above extended are not offered: "
                "they bake in kernels and layouts for the CPU that optimizes, so the file would not be portable."
            ),
        )
        disabled_optimizers: list[str] = Field(
            default_factory=list,
            description=(
                "Names of onnxruntime graph transformers / rewrite rules to turn off (for example ConstantSharing, "
                "MatMulAddFusion, GeluFusion). Names onnxruntime does not know are ignored by it."
            ),
        )

        @field_validator("disabled_optimizers")
        @classmethod
        def _distinct(cls, names: list[str]) -> list[str]:
            if len(set(names)) != len(names):
                raise ValueError(f"names an optimizer twice: {names}")
            return sorted(names)

    config: Config

    @classmethod
    def target_facet(cls, config: dict[str, Any], target_fingerprint: dict[str, Any] | None) -> dict[str, Any] | None:
        providers = _optimizing_providers(ort_target_of(target_fingerprint), str(config.get("level", "extended")))
        return {"providers": providers} if providers is not None else None

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        (onnxruntime,) = require("onnxruntime", self.name, "onnxruntime")
        from passes.quantize.onnx_facts import file_bytes, prune_unused_opsets

        cfg = self.config
        given = open_onnx_input(model, ctx)
        workdir, before = given.workdir, given.graph
        optimized = workdir / _OPTIMIZED_FILE
        optimized.unlink(missing_ok=True)
        (workdir / _OPTIMIZED_DATA).unlink(missing_ok=True)
        options = self._session_options(onnxruntime, optimized, large=file_bytes(given.source) > EXTERNAL_DATA_THRESHOLD)
        providers = _optimizing_providers(ort_target(ctx), cfg.level) or [CPU_PROVIDER]
        missing = [name for name in providers if name not in onnxruntime.get_available_providers()]
        if missing:
            raise ValueError(
                f"level {cfg.level} optimizes for the target's {', '.join(missing)}, which onnxruntime {onnxruntime.__version__} "
                f"here does not have (available: {', '.join(onnxruntime.get_available_providers())}); it would optimize for the CPU instead"
            )

        started = time.perf_counter()
        with quiet_library() as messages:
            onnxruntime.InferenceSession(
                str(given.source), options, providers=providers, disabled_optimizers=cfg.disabled_optimizers or None
            )
        seconds = round(time.perf_counter() - started, 3)
        if not optimized.exists():
            raise ValueError(f"onnxruntime wrote no optimized model to {optimized.name}")

        import onnx

        output = onnx.load(str(optimized))  # external data, if any, is read in from the workdir
        dropped = prune_unused_opsets(output)  # onnxruntime imports every domain it knows
        out_file = save_onnx(output, Path(ctx.output_dir))
        optimized.unlink()
        (workdir / _OPTIMIZED_DATA).unlink(missing_ok=True)
        details, notes = self._details(model, before, output, out_file, dropped, messages, seconds)
        details["providers"] = providers
        ctx.logger.debug("ort_graph_optimize %s: %d -> %d nodes", ctx.step_id, details["nodes_before"], details["nodes_after"])
        return onnx_output(model, ctx, details, notes)

    def _session_options(self, onnxruntime: Any, optimized: Path, large: bool) -> Any:
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = {
            "basic": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        }[self.config.level]
        options.optimized_model_filepath = str(optimized)
        options.log_severity_level = 3  # errors only: onnxruntime's native log goes straight to stderr
        if large:
            # protobuf cannot hold > 2 GiB: onnxruntime writes the weights next to the model
            options.add_session_config_entry("session.optimized_model_external_initializers_file_name", _OPTIMIZED_DATA)
            options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        return options

    def _details(
        self, model: ModelArtifact, before: Any, output: Any, out_file: Path, dropped: list[str], messages: list[str], seconds: float
    ) -> tuple[dict[str, Any], list[str]]:
        from passes.quantize.onnx_facts import file_bytes, initializer_bytes

        cfg = self.config
        counts_in, counts_out = qualified_op_counts(before), qualified_op_counts(output)
        contrib = contrib_ops(counts_out)
        notes = []
        if contrib:
            listed = ", ".join(f"{n} {op}" for op, n in contrib.items())
            notes.append(
                f"the optimized model contains onnxruntime contrib ops ({listed}): it runs on onnxruntime, other runtimes "
                "may not load it (level: basic keeps standard ops only)"
            )
        details = {
            "level": cfg.level,
            "disabled_optimizers": cfg.disabled_optimizers,
            "nodes_before": sum(counts_in.values()),
            "nodes_after": sum(counts_out.values()),
            "op_counts_before": counts_in,
            "op_counts_after": counts_out,
            "op_delta": op_delta(counts_in, counts_out),
            "contrib_ops": contrib,
            "initializer_bytes_before": initializer_bytes(before),
            "initializer_bytes_after": initializer_bytes(output),
            "size_bytes_before": file_bytes(model.model_file),
            "size_bytes_after": file_bytes(out_file),
            "dropped_opset_domains": dropped,
            "library_warnings": messages,
            "seconds": seconds,
        }
        return details, notes
