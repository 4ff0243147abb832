"""Weight-only compression with NNCF (``nncf.compress_weights``) on OpenVINO IR or ONNX.

Weights of MatMul / Gather / Conv ops are stored in INT8 or INT4 and decompressed at run time;
activations stay in floating point. INT8 needs no data. INT4 compresses ``ratio`` of the layers
in groups of ``group_size`` values (the rest fall back to ``backup_mode``); with a ``dataset``
NNCF chooses which layers by their sensitivity and may run AWQ / scale estimation.

ONNX inputs are read into OpenVINO in memory; the output is OpenVINO IR carrying the precision
hint of the input IR. numpy, openvino and nncf are imported inside ``run``: the engine imports
this module when it validates a workflow, and that must stay fast.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from engine.core import Categorical, ModelArtifact, PassConfig, PassContext, PassResult
from engine.core.refs import DatasetRef
from passes.openvino._base import IgnoredScope, OpenVinoPass, check_outputs_kept

INT4_GROUP_SIZE = 128


class NncfCompressWeights(OpenVinoPass):
    name = "nncf_compress_weights"
    summary = "Weight-only INT8 / INT4 compression of OpenVINO IR or ONNX with NNCF (activations stay in float)."
    version = "1"
    accepts = ("openvino", "onnx")
    produces = "openvino"
    libraries = ("openvino", "nncf")
    search_space = {"mode": Categorical(("INT8_ASYM", "INT8_SYM", "INT4_SYM", "INT4_ASYM")), "group_size": Categorical((32, 64, 128))}

    class Config(PassConfig):
        mode: Literal["INT8_ASYM", "INT8_SYM", "INT4_SYM", "INT4_ASYM"] = Field(
            default="INT8_ASYM", description="nncf.CompressWeightsMode: weight precision, with (ASYM) or without (SYM) a zero point."
        )
        group_size: int | None = Field(
            default=None,
            ge=1,
            description=f"INT4 modes: weights per quantization group (default {INT4_GROUP_SIZE}). INT8 modes quantize per output channel "
            "and ignore it (with a note).",
        )
        group_size_fallback: Literal["error", "ignore", "adjust"] = Field(
            default="error",
            description="INT4 modes, a layer whose channel size group_size does not divide: error (NNCF's default), ignore "
            "(leave the layer to backup_mode) or adjust (the largest power-of-two group size >= 32 that divides it).",
        )
        ratio: float | None = Field(
            default=None,
            gt=0,
            le=1,
            description="INT4 modes: share of the layers compressed to INT4, the rest to backup_mode (default 1). INT8 modes ignore it.",
        )
        backup_mode: Literal["INT8_ASYM", "INT8_SYM", "NONE"] | None = Field(
            default=None, description="INT4 modes: precision of the layers not in INT4 (nncf.BackupMode; default INT8_ASYM)."
        )
        all_layers: bool | None = Field(
            default=None,
            description="INT4 modes: compress the embeddings and the last layer to INT4 too (NNCF keeps them in backup_mode by default).",
        )
        ignored_scope: IgnoredScope = Field(default_factory=IgnoredScope, description="Nodes whose weights stay as they are.")
        dataset: DatasetRef | None = Field(
            default=None,
            description="INT4 modes: a dataset making the compression data-aware (layer sensitivity for ratio < 1, AWQ, scale estimation). "
            "Omit for data-free compression.",
        )
        subset_size: int = Field(default=128, ge=1, description="Samples of `dataset` used; capped at its size.")
        awq: bool = Field(default=False, description="INT4 with a dataset: activation-aware weight quantization (AWQ).")
        scale_estimation: bool = Field(default=False, description="INT4 with a dataset: estimate scales that minimize the output error.")

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        # nncf and openvino take seconds to import: only when the pass runs. Telemetry is declined
        # before nncf is imported: its import sets up (and may send) usage statistics
        from passes.openvino._quiet import decline_telemetry, library_output

        decline_telemetry()
        import nncf

        from passes.openvino import _nncf

        cfg = self.config
        notes: list[str] = []
        source = _nncf.read(model)
        options = self._options(ctx, source, notes)

        started = time.perf_counter()
        with library_output() as output:
            compressed = nncf.compress_weights(source.model, **{k: v for k, v in options.items() if v is not None})
        seconds = round(time.perf_counter() - started, 3)
        check_outputs_kept(source.model, compressed)
        _nncf.write(compressed, ctx, source.hint)
        facts = _nncf.quantization_facts(source, compressed)
        if not facts["quantized_ops"]:
            notes.append("NNCF compressed no weight: the model has no MatMul, Gather or Conv with constant weights outside ignored_scope")
        details: dict[str, Any] = {
            **source.facts,
            "mode": cfg.mode,
            "group_size": options.get("group_size", -1),
            "ratio": options.get("ratio", 1.0),
            "data_aware": "dataset" in options,
            "compressed_ops": facts["quantized_ops"],
            "node_count_after": facts["node_count_after"],
            "weight_bytes_before": facts["weight_bytes_before"],
            "weight_bytes_after": facts["weight_bytes_after"],
            "ignored_scope": cfg.ignored_scope.to_json(),
            "inference_precision_hint": source.hint,
            "bitwidth_table": next((m for m in output.texts("nncf") if "bitwidth" in m), None),
            "library_warnings": output.lines(),
            "seconds": seconds,
        }
        return PassResult(
            model=ModelArtifact.from_folder("openvino", Path(ctx.output_dir), attrs=model.attrs), details=details, notes=notes
        )

    def _options(self, ctx: PassContext, source: Any, notes: list[str]) -> dict[str, Any]:
        """The arguments of ``nncf.compress_weights`` (None: not given)."""
        import nncf
        from nncf.quantization.advanced_parameters import AdvancedCompressionParameters, GroupSizeFallbackMode

        from passes.openvino import _nncf

        cfg = self.config
        int4 = cfg.mode.startswith("INT4")
        options: dict[str, Any] = {"mode": getattr(nncf.CompressWeightsMode, cfg.mode)}
        if int4:
            options["group_size"] = cfg.group_size or INT4_GROUP_SIZE
            options["ratio"] = cfg.ratio if cfg.ratio is not None else 1.0
            options["all_layers"] = cfg.all_layers
            options["backup_mode"] = getattr(nncf.BackupMode, cfg.backup_mode) if cfg.backup_mode else None
            options["advanced_parameters"] = AdvancedCompressionParameters(
                group_size_fallback_mode=getattr(GroupSizeFallbackMode, cfg.group_size_fallback.upper())
            )
            if cfg.dataset is not None:
                items = _nncf.calibration_items(ctx, cfg.dataset, source.model)
                options["dataset"] = nncf.Dataset(items)
                options["subset_size"] = _nncf.subset(cfg.subset_size, len(items), notes)
                options["awq"], options["scale_estimation"] = cfg.awq or None, cfg.scale_estimation or None
            elif cfg.awq or cfg.scale_estimation:
                raise ValueError("awq and scale_estimation need a dataset: set the option dataset")
        else:
            ignored = [name for name in ("group_size", "ratio", "backup_mode", "all_layers", "dataset") if getattr(cfg, name) is not None]
            ignored += [name for name in ("awq", "scale_estimation") if getattr(cfg, name)]
            if ignored:
                notes.append(f"{cfg.mode} compresses every layer per output channel without data: ignored {', '.join(ignored)}")
        if not cfg.ignored_scope.is_empty():
            options["ignored_scope"] = cfg.ignored_scope.to_nncf()
        return options
