"""Chooses which weight nodes of a decoder keep 8 bits (or float) when the rest is quantized to 4
bits: Olive's ``SelectiveMixedPrecision``, on the ONNX model.

Like Olive's pass it quantizes nothing: it writes its choice into the model (ONNX metadata entry
``kiln.mixed_precision``: ``{"default": {"bits": 4, ...}, "overrides": {node: {"bits": 8}}}``) and
a following ``int4_weights`` step quantizes with it (``passes.quantize.nbits_plan``), so a recipe
chains ``mixed_precision`` -> ``int4_weights`` as Olive's chains ``SelectiveMixedPrecision`` ->
its quantizer. The choice is part of the model's bytes, hence of the quantizing job's key.

Algorithms (``passes.quantize.precision_select``):

- ``k_quant_last`` / ``k_quant_down`` / ``k_quant_mixed``: Olive's presets by layer: the LM head;
  plus the MLP down projections (``_down``), plus q/k/v (``_mixed``) of the first and last eighth
  of the layers and every third layer between.
- ``roles``: the weights of the named ``roles`` (``lm_head``, ``embeddings``, ``qkv``, ``o_proj``,
  ``mlp_up``, ``mlp_down``), in the first ``first_layers`` and last ``last_layers`` layers (both 0:
  all), plus the nodes matching ``nodes`` (shell patterns).
- ``weight_snr`` (no data) and ``output_error`` (measured on ``calibration``): units ranked by
  sensitivity at ``block_size`` / ``is_symmetric`` 4-bit round to nearest, the most sensitive moved
  to ``high_bits`` until ``1 - ratio`` of the weights are (Olive's ``ratio``: the share kept at 4
  bits).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveInt, model_validator

from engine.core import Categorical, ModelArtifact, PassConfig, PassContext, PassResult
from engine.core.refs import DatasetRef
from passes.common.onnx_io import OnnxPass, save_onnx
from passes.common.pass_io import onnx_output
from passes.quantize.nbits_plan import write_metadata

Role = Literal["lm_head", "embeddings", "qkv", "o_proj", "mlp_up", "mlp_down"]


class MixedPrecision(OnnxPass):
    name = "mixed_precision"
    summary = "Chooses the weight nodes that keep 8 bits (or float) under 4-bit weight quantization (presets, roles, or measured sensitivity) and writes the plan int4_weights follows."
    version = "1"
    accepts = ("onnx", "genai")
    produces = "onnx"
    keeps = ("genai",)
    libraries = ("onnx", "onnxruntime", "numpy")
    search_space = {
        "algorithm": Categorical(("k_quant_last", "k_quant_down", "k_quant_mixed")),
        "high_bits": Categorical((8, 16)),
        "block_size": Categorical((32, 64, 128)),
        "first_layers": Categorical((0, 1, 2)),
        "last_layers": Categorical((0, 1, 2)),
    }

    class Config(PassConfig):
        algorithm: Literal["k_quant_last", "k_quant_down", "k_quant_mixed", "roles", "weight_snr", "output_error"] = Field(
            "k_quant_mixed",
            description="How the high-precision nodes are chosen: Olive's k_quant_* presets, roles, or ranked by weight_snr (no data) / output_error (measured on calibration).",
        )
        high_bits: Literal[8, 16] = Field(8, description="What the chosen nodes get: 8 bits, or 16 (kept float).")
        roles: list[Role] = Field(default_factory=lambda: ["lm_head"], description="algorithm roles: the roles kept at high_bits.")
        first_layers: int = Field(
            0, ge=0, description="algorithm roles: layer roles apply to the first this many layers (with last_layers; both 0: all layers)."
        )
        last_layers: int = Field(0, ge=0, description="algorithm roles: ... and to the last this many layers.")
        nodes: list[str] = Field(
            default_factory=list, description="Further node names or shell patterns kept at high_bits (any algorithm)."
        )
        ratio: float | None = Field(
            None,
            gt=0,
            lt=1,
            description="weight_snr / output_error: the share of the weights (by count) that stays at 4 bits, as Olive's ratio.",
        )
        block_size: Literal[16, 32, 64, 128, 256] = Field(
            32, description="weight_snr / output_error: the block size of the 4-bit quantization scored."
        )
        is_symmetric: bool = Field(True, description="weight_snr / output_error: symmetric or asymmetric 4-bit quantization is scored.")
        calibration: DatasetRef | None = Field(
            None, description="output_error: the dataset of model inputs (input_ids; an empty cache and a full mask are added)."
        )
        calibration_samples: PositiveInt = Field(4, description="output_error: at most this many samples are run.")

        @model_validator(mode="after")
        def _check(self) -> MixedPrecision.Config:
            scored = self.algorithm in ("weight_snr", "output_error")
            if scored and self.ratio is None:
                raise ValueError(f"algorithm {self.algorithm} needs ratio: the share of the weights kept at 4 bits (0 < ratio < 1)")
            if not scored and self.ratio is not None:
                raise ValueError(f"ratio is used by algorithms weight_snr and output_error, not {self.algorithm}")
            if (self.algorithm == "output_error") != (self.calibration is not None):
                raise ValueError("calibration is needed by, and used by, algorithm output_error only")
            return self

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        import fnmatch

        import onnx

        from passes.quantize import precision_select as select

        cfg = self.config
        source = onnx.load(str(model.model_file))
        weights = select.weights_of(source)
        notes: list[str] = []
        started = time.perf_counter()
        scores: dict[str, float] = {}
        if cfg.algorithm.startswith("k_quant"):
            chosen = select.k_quant_preset(weights, cfg.algorithm)
        elif cfg.algorithm == "roles":
            chosen = select.by_roles(weights, list(cfg.roles), cfg.first_layers, cfg.last_layers)
        else:
            chosen, scores = self._scored(source, weights, ctx, select.cache_dims(model.path))
        for pattern in cfg.nodes:
            matched = [w.node for w in weights if fnmatch.fnmatchcase(w.node, pattern)]
            if not matched:
                raise ValueError(f"nodes: no weight node matches {pattern!r}")
            chosen.extend(matched)
        chosen = sorted(set(chosen))
        if not chosen:
            notes.append("no node was chosen (no node name says its role?): int4_weights will quantize every node alike")
        default = {"bits": 4, "block_size": cfg.block_size, "is_symmetric": cfg.is_symmetric}
        write_metadata(source, {"default": default, "overrides": {name: {"bits": cfg.high_bits} for name in chosen}})
        save_onnx(source, Path(ctx.output_dir))
        matmuls = [w for w in weights if w.role != "embeddings"]
        high = sum(w.size for w in matmuls if w.node in set(chosen))
        details: dict[str, Any] = {
            "algorithm": cfg.algorithm,
            "high_bits": cfg.high_bits,
            "chosen": chosen,
            "candidates": len(weights),
            "roles": {w.node: w.role for w in weights},
            "low_bit_share": round(1 - high / max(sum(w.size for w in matmuls), 1), 4),  # of the MatMul weights
            "scores": {unit: round(score, 6) for unit, score in sorted(scores.items())},
            "seconds": round(time.perf_counter() - started, 3),
        }
        return onnx_output(model, ctx, details, notes)

    def _scored(self, source: Any, weights: list[Any], ctx: PassContext, dims: dict[str, int]) -> tuple[list[str], dict[str, float]]:
        """The units chosen by score, and every unit's score (higher: more sensitive)."""
        from onnx import numpy_helper

        from passes.quantize import precision_select as select

        cfg = self.config
        matmuls = [w for w in weights if w.role != "embeddings"]  # a Gather's table is not scored: it is kept by role
        groups = select.units(matmuls)

        def quantize(array: Any) -> Any:
            return select.fake_quantize(array, 4, cfg.block_size, cfg.is_symmetric)

        if cfg.algorithm == "weight_snr":
            tables = {t.name: numpy_helper.to_array(t) for t in source.graph.initializer if t.name in {w.weight for w in matmuls}}
            scores = {
                unit: -min(select.snr_db(tables[w.weight], quantize(tables[w.weight])) for w in members) for unit, members in groups.items()
            }
        else:
            assert cfg.calibration is not None  # the validator ensures it
            dataset = ctx.dataset(cfg.calibration)
            if len(dataset) == 0:
                raise ValueError(f"calibration dataset '{cfg.calibration}' is empty")
            batches = list(dataset.batches(1, limit=cfg.calibration_samples))
            scores = select.output_errors(source, groups, batches, quantize, dims)
        sizes = {unit: sum(w.size for w in members) for unit, members in groups.items()}
        units = select.promote(scores, sizes, float(cfg.ratio or 0.5))
        return [w.node for unit in units for w in groups[unit]], scores
