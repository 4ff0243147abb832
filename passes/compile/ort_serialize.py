"""The offline-optimized model: onnxruntime optimizes the graph once, here, and the result is saved.

A session optimizes its model every time it opens; an offline-optimized model (onnxruntime's
``SessionOptions.optimized_model_filepath``) moves that work out of the start-up. The level says
how far it goes and what the file is then good for:

- ``basic``: standard-op rewrites only (constant folding, redundant nodes, Conv+BN...). The output
  is plain ONNX, the same for every execution provider and host: the pass is shared by targets.
- ``extended``: also fusions into onnxruntime's contrib ops, which onnxruntime applies only for
  the execution providers that run them: the output is made for the target's providers.
- ``all`` (default): also layout transforms and kernels chosen for the CPU that optimizes (NCHWc
  blocking for its vector width). onnxruntime says such a model "should only be used in the same
  environment the model was optimized in": it is valid for the target's providers on this kind of
  host only.

Above ``basic`` the pass is target-dependent: it runs with the target's providers and its key holds
the target's fingerprint (``target_facet``). The session that loads an offline-optimized
model can then be opened with optimizations off (the target's ``graph_optimization_level:
disable``), which is where the start-up win comes from; with the target's default level the
optimizers run again and find little left to do.

``ort_format: true`` also writes the model in the ORT format (``model.ort`` beside ``model.onnx``,
same level), the format of onnxruntime's minimal builds (mobile, web). It travels with the artifact;
the artifact's format stays ``onnx`` because that is what the target and every later pass open (a
pass produces one format, and no Kiln target runs a minimal build). onnxruntime lays the ORT file
out differently at every save (same content); the pass rewrites it in one fixed layout
(``passes.compile._ort_format``), so that the same input and config give the same bytes.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from engine.core import ModelArtifact, PassConfig, PassContext, PassResult
from passes.common.graph_tools import contrib_ops, qualified_op_counts, quiet_library
from passes.common.onnx_io import EXTERNAL_DATA_THRESHOLD, OnnxPass, save_onnx
from passes.common.pass_io import onnx_output, open_onnx_input, require
from passes.compile._ort_format import canonicalize_ort_file
from passes.compile._target import CPU, Providers, target_providers

_OPTIMIZED_FILE = "optimized.onnx"
_OPTIMIZED_DATA = "optimized.onnx.data"
ORT_FILE = "model.ort"

_LEVELS = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


class OrtSerialize(OnnxPass):
    name = "ort_serialize"
    summary = (
        "Save onnxruntime's offline-optimized model (basic: portable; extended/all: made for the target's execution providers "
        "and host), optionally also in the ORT format of minimal builds, so that sessions start without optimizing."
    )
    version = "1"
    accepts = ("onnx",)
    produces = "onnx"
    #: keyed by the target above level basic only: ``target_facet`` answers per config
    target_dependent = False
    libraries = ("onnx", "onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino")

    class Config(PassConfig):
        level: Literal["basic", "extended", "all"] = Field(
            "all",
            description=(
                "onnxruntime graph optimization level applied offline. basic: standard-op rewrites, plain portable ONNX, shared "
                "by all targets. extended: also contrib-op fusions for the target's execution providers. all: also layout "
                "transforms for the CPU that optimizes; the model is valid only for the target's providers on this kind of host."
            ),
        )
        ort_format: bool = Field(
            False,
            description="Also write the model in the ORT format (model.ort beside model.onnx), the format onnxruntime's minimal builds load.",
        )

    config: Config

    @classmethod
    def target_facet(cls, config: dict[str, Any], target_fingerprint: dict[str, Any] | None) -> dict[str, Any] | None:
        # above basic, the optimized graph is made for the target's providers (and this host)
        return target_fingerprint if cls.Config.model_validate(config).level != "basic" else None

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        (onnxruntime,) = require("onnxruntime", self.name, "onnxruntime")
        from passes.quantize.onnx_facts import file_bytes, prune_unused_opsets

        cfg = self.config
        providers = target_providers(ctx) if cfg.level != "basic" else Providers([CPU], [{}])
        given = open_onnx_input(model, ctx)
        workdir = given.workdir
        optimized = workdir / _OPTIMIZED_FILE
        for leftover in (optimized, workdir / _OPTIMIZED_DATA):
            leftover.unlink(missing_ok=True)
        large = file_bytes(given.source) > EXTERNAL_DATA_THRESHOLD

        started = time.perf_counter()
        messages = self._optimize(onnxruntime, given.source, optimized, providers, large)
        seconds = round(time.perf_counter() - started, 3)
        if not optimized.exists():
            raise ValueError(f"onnxruntime wrote no optimized model to {optimized.name}")

        import onnx

        output = onnx.load(str(optimized))
        dropped = prune_unused_opsets(output)
        out_dir = Path(ctx.output_dir)
        out_file = save_onnx(output, out_dir)
        optimized.unlink()
        (workdir / _OPTIMIZED_DATA).unlink(missing_ok=True)
        ort_bytes, ort_canonical = None, True
        if cfg.ort_format:
            if large:
                raise ValueError("the ORT format holds no external data: a model over 1.8 GB cannot be written as ORT")
            ort_canonical = self._write_ort(onnxruntime, given.source, out_dir / ORT_FILE, providers, messages)
            ort_bytes = (out_dir / ORT_FILE).stat().st_size

        counts_in, counts_out = qualified_op_counts(given.graph), qualified_op_counts(output)
        details: dict[str, Any] = {
            "level": cfg.level,
            **providers.to_json(),
            "portable": cfg.level == "basic",
            "host": {"machine": platform.machine(), "processor": platform.processor() or None},
            "nodes_before": sum(counts_in.values()),
            "nodes_after": sum(counts_out.values()),
            "op_counts_after": counts_out,
            "contrib_ops": contrib_ops(counts_out),
            "size_bytes_before": file_bytes(model.model_file),
            "size_bytes_after": file_bytes(out_file),
            "ort_file": ORT_FILE if cfg.ort_format else None,
            "ort_bytes": ort_bytes,
            "dropped_opset_domains": dropped,
            "library_warnings": messages,
            "seconds": seconds,
        }
        notes = [] if ort_canonical else [f"{ORT_FILE} is laid out as onnxruntime wrote it: its bytes may differ from one run to the next"]
        if cfg.level != "basic":
            notes.append(
                f"optimized at level {cfg.level} for {', '.join(providers.names)}: the model is meant for these execution providers"
                + (" on this kind of host (level all bakes in layouts for this CPU)" if cfg.level == "all" else "")
            )
        ctx.logger.debug("ort_serialize %s: %d -> %d nodes", ctx.step_id, details["nodes_before"], details["nodes_after"])
        return onnx_output(model, ctx, details, notes)

    def _write_ort(self, onnxruntime: Any, source: Path, path: Path, providers: Providers, messages: list[str]) -> bool:
        """Write the ORT format file at ``path`` in its canonical layout (False: onnxruntime's own, see
        ``passes.compile._ort_format``); onnxruntime's messages are added to ``messages``."""
        messages += self._optimize(onnxruntime, source, path, providers, large=False, ort_format=True)
        return canonicalize_ort_file(path)  # onnxruntime lays the file out differently at every save

    def _optimize(
        self, onnxruntime: Any, source: Path, path: Path, providers: Providers, large: bool, ort_format: bool = False
    ) -> list[str]:
        """Open ``source`` once with ``providers`` so that onnxruntime writes its optimized graph to ``path``."""
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = getattr(onnxruntime.GraphOptimizationLevel, _LEVELS[self.config.level])
        options.optimized_model_filepath = str(path)
        options.log_severity_level = 3
        if ort_format:
            options.add_session_config_entry("session.save_model_format", "ORT")
        elif large:
            options.add_session_config_entry("session.optimized_model_external_initializers_file_name", _OPTIMIZED_DATA)
            options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        with quiet_library() as messages:
            try:
                onnxruntime.InferenceSession(str(source), options, providers=providers.names, provider_options=providers.options)
            except Exception as error:
                if "compiled nodes" in str(error).lower() or ("compiled" in str(error).lower() and "serializ" in str(error).lower()):
                    raise ValueError(
                        f"onnxruntime cannot save an optimized model for {', '.join(providers.names)}: an execution provider "
                        f"compiled part of the graph ({error}). Use the ort_compile pass for such providers, or level basic."
                    ) from error
                raise
        return list(messages)
