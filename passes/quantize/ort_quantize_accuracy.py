"""INT8 quantization with onnxruntime, tuned until one of the workflow's metrics clears a bar: the
most sensitive nodes fall back to float, step by step (in the spirit of Intel Neural Compressor's
accuracy-driven tuning, whose ONNX support is gone upstream).

1. The input is preprocessed once (``quant_pre_process``, as ``ort_quantize`` does), unnamed
   nodes get names, and that float model is what every iteration quantizes, so node names and
   the calibration ranges (cached in the pass's cache folder) hold across iterations.
2. The first model is quantized with the given options (``ort_quantize``'s own code), written to
   ``workdir/iter_0/model.onnx`` and measured with ``ctx.measure(validation, model)`` (on the
   step's target, against the step's input model). When ``metric`` clears the bar (``min`` /
   ``max``), that model is the output.
3. Otherwise the quantization noise of every quantized tensor and weight is measured once, on the
   first model (``passes.quantize._sensitivity``: onnxruntime's QDQ debugging tools, a few
   calibration samples; weights only in dynamic mode). Once is enough: a point's noise depends on
   its range and its values, not on which other nodes are quantized, so the ranking barely moves
   as nodes fall back, while measuring it again would cost more than the quantization does. The
   ranking makes a ladder of ``max_iterations`` rungs: each rung leaves in float what the one
   below does plus the nodes asking for the noisiest points not yet excluded (``fallback:
   nodes``, at least ``nodes_per_step`` of them) or every node of the op type adding the most
   noise (``fallback: op_types``).
4. The lowest rung that clears the bar is searched for (``workdir/iter_<rung>``), rung 1 first
   (the noisiest nodes are most often all the bar needs), then by bisection (``search: bisect``,
   the default: 8 rungs take 5 models at most, the first included, where climbing them takes up
   to 8; it takes more nodes in float to bring a model no further from the bar, which is what the
   ranking intends; on MiniLM's accuracy-driven dynamic INT8 the same rung came out, 12 nodes in
   float, from 5 models instead of 7), or rung by rung (``linear``).
5. When no rung measured clears the bar, ``on_failure: best`` outputs the best model measured
   (closest to the bar; fewer float nodes among equals) with a note, and ``error`` fails with the
   trajectory (every model measured, in the order measured, with its rung).

onnx, onnxruntime and numpy are imported inside functions: the engine imports this module when
it validates a workflow, only to read ``Config``.
"""

from __future__ import annotations

import functools
import math
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core import Categorical, KilnError, ModelArtifact, PassContext, PassResult
from passes.common.graph_tools import runtime_loadable
from passes.common.library_logs import capture_library_logs
from passes.common.onnx_io import EXTERNAL_DATA_THRESHOLD, OnnxPass, save_onnx
from passes.common.pass_io import require
from passes.quantize.onnx_facts import file_bytes, iter_nodes
from passes.quantize.ort_quantize import OrtQuantize, preprocess_for_quantization
from passes.quantize.ort_quantize_accuracy_config import OrtQuantizeAccuracyConfig

if TYPE_CHECKING:
    import onnx

#: names listed per iteration in the details (the final list is given in full)
_NAMES_SHOWN = 16


class OrtQuantizeAccuracy(OnnxPass):
    name = "ort_quantize_accuracy"
    summary = "INT8 quantization with onnxruntime that falls the most sensitive nodes back to float until a workflow metric clears a bar."
    version = "2"  # 2: the rungs bisected by default (search)
    accepts = ("onnx",)
    produces = "onnx"
    target_dependent = True
    libraries = ("onnx", "onnxruntime")
    search_space = {
        "nodes_per_step": Categorical((2, 4, 8)),
        "fallback": Categorical(("nodes", "op_types")),
        "per_channel": Categorical((False, True)),
        "calibration_method": Categorical(("MinMax", "Entropy", "Percentile")),
    }

    Config = OrtQuantizeAccuracyConfig
    config: OrtQuantizeAccuracyConfig

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        (onnx,) = require("onnx", self.name, "onnx")
        cfg = self.config
        if ctx.measure is None:
            raise KilnError(f"step '{ctx.step_id}' needs the engine's measure function to run evaluation '{cfg.validation}'")
        workdir = Path(ctx.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        notes: list[str] = []
        started = time.perf_counter()
        float_model, preprocess_state = self._float_model(model, workdir, notes)
        graph = onnx.load(str(float_model.model_file), load_external_data=False)
        op_of = {node.name: node.op_type for node in iter_nodes(graph.graph) if node.name}
        runs, stopped, sensitivity = self._iterate(ctx, float_model, graph, op_of)
        chosen = min(range(len(runs)), key=lambda i: (self._shortfall(runs[i].value), len(runs[i].excluded), i))
        best = runs[chosen]
        met = self._meets(best.value)
        if not met:
            notes.append(self._shortfall_note(runs, chosen, stopped))
        shutil.copytree(best.result.model.path, ctx.output_dir, dirs_exist_ok=True)
        output = ModelArtifact.from_folder("onnx", Path(ctx.output_dir), attrs=model.attrs)
        notes.extend(best.result.notes)
        details: dict[str, Any] = {
            "mode": cfg.mode,
            "validation": cfg.validation,
            "metric": cfg.metric,
            "bar": {"min": cfg.min, "max": cfg.max},
            "bar_met": met,
            "final_metric": best.value,
            "chosen_iteration": chosen,
            "iterations": len(runs),
            "stopped": stopped,
            "fallback": cfg.fallback,
            "excluded_nodes": best.excluded,
            "excluded_count": len(best.excluded),
            "excluded_op_types": dict(sorted(Counter(op_of.get(n, "?") for n in best.excluded).items())),
            "trajectory": self._trajectory(runs),
            "preprocess": preprocess_state,
            "sensitivity": sensitivity,
            "quantization": {key: best.result.details.get(key) for key in _QUANTIZATION_FACTS},
            "seconds": round(time.perf_counter() - started, 3),
        }
        if cfg.fallback == "op_types":
            details["fallen_op_types"] = best.rung.fallen
        return PassResult(model=output, details=details, notes=notes)

    def _iterate(
        self, ctx: PassContext, float_model: ModelArtifact, graph: onnx.ModelProto, op_of: dict[str, str]
    ) -> tuple[list[_Run], str, dict[str, Any] | None]:
        """Quantize with nothing more in float and measure; when that misses the bar, rank the nodes
        and climb the ladder of fallbacks (rung i: the first i steps in float), rung by rung or by
        bisection, until the lowest rung that meets the bar is found or nothing is left to try:
        every run in the order measured, why the search stopped, and the ranking's details."""
        from passes.quantize import _sensitivity

        cfg = self.config
        workdir = Path(ctx.workdir)
        datasets = {name: functools.cache(loader) for name, loader in ctx.datasets.items()}
        quantize = self._quantizer(ctx, float_model, datasets)
        runs = [self._run_rung(ctx, quantize, _Rung(0, list(cfg.nodes_to_exclude), [], None))]
        if self._meets(runs[0].value) or cfg.max_iterations == 1:
            return runs, "bar_met" if self._meets(runs[0].value) else "max_iterations", None
        ranked, sensitivity, candidates = self._rank(graph, runs[0], datasets, quantize, workdir)
        op_order = _sensitivity.op_type_ranking(ranked, op_of)
        sensitivity["op_types"] = dict(op_order)
        ladder = self._ladder(runs[0].rung, ranked, op_order, candidates, op_of)
        if len(ladder) == 1:
            return runs, "nothing_left_to_fall_back", sensitivity
        met = self._climb(ctx, quantize, ladder, runs)
        if met:
            return runs, "bar_met", sensitivity
        return runs, "max_iterations" if len(ladder) == cfg.max_iterations else "nothing_left_to_fall_back", sensitivity

    def _ladder(
        self, first: _Rung, ranked: list[Any], op_order: list[tuple[str, float]], candidates: list[str], op_of: dict[str, str]
    ) -> list[_Rung]:
        """The rungs the search may measure, up to ``max_iterations``: ``first`` (rung 0, as given), each
        next one the previous with the next noisiest nodes (``nodes_per_step`` at least) or the next op type in float."""
        from passes.quantize import _sensitivity

        cfg = self.config
        ladder = [first]
        while len(ladder) < cfg.max_iterations:
            below = ladder[-1]
            if cfg.fallback == "nodes":
                new, op_type = _sensitivity.next_nodes(ranked, set(below.excluded), cfg.nodes_per_step), None
            else:
                new, op_type = _next_op_type(op_order, [r.op_type for r in ladder], candidates, below.excluded, op_of)
            if not new:
                break
            ladder.append(_Rung(len(ladder), below.excluded + new, new, op_type, below.fallen + ([op_type] if op_type else [])))
        return ladder

    def _climb(self, ctx: PassContext, quantize: Any, ladder: list[_Rung], runs: list[_Run]) -> bool:
        """Measure rungs of ``ladder`` (rung 0 is ``runs[0]``, below the bar) until the lowest rung that
        meets the bar is known, appending to ``runs``; whether one does. Rung 1 first: the noisiest
        nodes are most often all the bar needs. Then ``search: bisect`` halves the rungs left at each
        measurement (a model with more nodes in float is taken to be no further from the bar than one
        with fewer, as the ranking intends), ``linear`` climbs one rung at a time."""
        below, above = 0, len(ladder)  # rung `below` misses the bar; every rung from `above` up meets it, if any does
        while above - below > 1:
            step = self.config.search == "linear" or below == 0
            rung = ladder[below + 1] if step else ladder[(below + above) // 2]
            runs.append(self._run_rung(ctx, quantize, rung))
            if self._meets(runs[-1].value):
                above = rung.index
                if self.config.search == "linear":
                    break
            else:
                below = rung.index
        return above < len(ladder)

    def _run_rung(self, ctx: PassContext, quantize: Any, rung: _Rung) -> _Run:
        began = time.perf_counter()
        result = quantize(rung.excluded, Path(ctx.workdir) / f"iter_{rung.index}")
        quantized = time.perf_counter()
        value = self._measure(ctx, result.model)
        seconds = {"quantize": round(quantized - began, 3), "measure": round(time.perf_counter() - quantized, 3)}
        ctx.logger.info("%s: rung %d, %d nodes in float, %s %s", ctx.step_id, rung.index, len(rung.excluded), self.config.metric, value)
        return _Run(result, value, rung, seconds)

    def _quantizer(self, ctx: PassContext, float_model: ModelArtifact, datasets: dict[str, Any]) -> Any:
        """``quantize(excluded, output_dir, **override)``: ort_quantize of the float model with
        ``excluded`` nodes left in float (``override``: config changes)."""
        cfg = self.config
        workdir = Path(ctx.workdir)
        cache_dir = Path(ctx.cache_dir) if ctx.cache_dir is not None else workdir / "calibration_cache"

        def quantize(excluded: list[str], output_dir: Path, **override: Any) -> PassResult:
            shutil.rmtree(output_dir, ignore_errors=True)
            sub = PassContext(
                step_id=ctx.step_id,
                workdir=workdir / "quantize",
                output_dir=output_dir,
                datasets=datasets,
                cache_dir=cache_dir,
                logger=ctx.logger,
            )
            Path(sub.workdir).mkdir(parents=True, exist_ok=True)
            options = cfg.quantize_options(excluded).model_copy(update=override)
            return _Quantize(options).run(float_model, sub)

        return quantize

    def _trajectory(self, runs: list[_Run]) -> list[dict[str, Any]]:
        return [run.summary(i, self._meets(run.value)) for i, run in enumerate(runs)]

    def _shortfall_note(self, runs: list[_Run], chosen: int, stopped: str) -> str:
        """The note for a search that never met the bar; raises instead when ``on_failure`` is error."""
        cfg = self.config
        best = runs[chosen]
        steps = "; ".join(
            f"iteration {t['iteration']}: {t['excluded']} nodes in float, {cfg.metric} {t['metric']:.6g}" for t in self._trajectory(runs)
        )
        why = "no node was left to fall back" if stopped == "nothing_left_to_fall_back" else f"max_iterations ({cfg.max_iterations})"
        if cfg.on_failure == "error":
            raise KilnError(f"{cfg.validation}.{cfg.metric} never cleared the bar ({self._bar()}) before {why}: {steps}")
        return (
            f"{cfg.validation}.{cfg.metric} did not clear the bar ({self._bar()}) before {why}; the output is the best model found: "
            f"iteration {chosen}, {len(best.excluded)} nodes in float, {cfg.metric} {best.value:.6g}"
        )

    # --------------------------------------------------------------------------------------------

    def _float_model(self, model: ModelArtifact, workdir: Path, notes: list[str]) -> tuple[ModelArtifact, str]:
        """The model every iteration quantizes: preprocessed once, every node named, saved in ``workdir/float``."""
        import onnx

        from passes.quantize import _sensitivity

        cfg = self.config
        source = runtime_loadable(model.model_file, workdir)
        keep_names = bool(cfg.nodes_to_quantize or cfg.nodes_to_exclude)
        with capture_library_logs() as messages:
            to_quantize, state = preprocess_for_quantization(
                source, workdir, cfg.preprocess, keep_names, file_bytes(source) > EXTERNAL_DATA_THRESHOLD, messages, notes
            )
        graph = onnx.load(str(to_quantize))
        named = _sensitivity.name_nodes(graph)
        if named:
            notes.append(f"{named} unnamed nodes were named <op_type>_<index> so that they can be left in float")
        folder = workdir / "float"
        shutil.rmtree(folder, ignore_errors=True)
        save_onnx(graph, folder)
        return ModelArtifact.from_folder("onnx", folder), state

    def _rank(
        self, graph: onnx.ModelProto, first: _Run, datasets: dict[str, Any], quantize: Any, workdir: Path
    ) -> tuple[list[Any], dict[str, Any], list[str]]:
        """The quantization points of the first model, worst first; what the details say of them; the
        nodes that may fall back (of the quantized op types, not excluded from the start), in graph order."""
        from passes.quantize import _sensitivity
        from passes.quantize.calibration import model_inputs, prepare_feed

        cfg = self.config
        wanted = set(first.result.details["op_types_to_quantize"])
        if cfg.mode == "dynamic" and "MatMul" in wanted:
            wanted.add("Gemm")  # quantize_dynamic rewrites Gemm to MatMul; ort_quantize excludes it by its Gemm name
        allowed = set(cfg.nodes_to_quantize or [n.name for n in graph.graph.node])
        candidates = [n.name for n in graph.graph.node if n.op_type in wanted and n.name in allowed and n.name not in first.excluded]
        quantized_file = first.result.model.model_file
        batches = None
        if cfg.sensitivity == "activation_error":
            assert cfg.calibration is not None  # the config's validator sees to it
            dataset = datasets[cfg.calibration]()
            batches = prepare_feed(dataset, cfg.calibration, model_inputs(graph), min(cfg.sensitivity_samples, len(dataset)), 1).batches
            if cfg.quant_format != "QDQ":
                # a QOperator model has no Q/DQ pairs to compare: measure its QDQ twin (same ranges, same nodes)
                quantized_file = quantize(first.excluded, workdir / "sensitivity_qdq", quant_format="QDQ").model.model_file
        float_file = workdir / "float" / "model.onnx"
        with capture_library_logs():
            ranked, seconds = _sensitivity.measure(float_file, quantized_file, batches, set(candidates), workdir)
        return ranked, _sensitivity.describe(ranked, seconds, len(batches or [])), candidates

    def _measure(self, ctx: PassContext, model: ModelArtifact) -> float:
        cfg = self.config
        assert ctx.measure is not None
        values = ctx.measure(cfg.validation, model).values
        if cfg.metric not in values:
            raise KilnError(
                f"evaluation '{cfg.validation}' gives no value '{cfg.metric}' (config.metric); it gives: {', '.join(sorted(values)) or 'none'}"
            )
        return float(values[cfg.metric])

    def _meets(self, value: float) -> bool:
        cfg = self.config
        if math.isnan(value):
            return False
        return (cfg.min is None or value >= cfg.min) and (cfg.max is None or value <= cfg.max)

    def _shortfall(self, value: float) -> float:
        cfg = self.config
        if math.isnan(value):
            return math.inf
        return max(0.0, (cfg.min - value) if cfg.min is not None else 0.0) + max(0.0, (value - cfg.max) if cfg.max is not None else 0.0)

    def _bar(self) -> str:
        cfg = self.config
        return " and ".join(
            part for part in (f"min {cfg.min:g}" if cfg.min is not None else "", f"max {cfg.max:g}" if cfg.max is not None else "") if part
        )


_QUANTIZATION_FACTS = ("quantized_ops", "unquantized_nodes", "op_types_to_quantize", "nodes_after", "size_bytes_after", "calibration")


@dataclass
class _Rung:
    """A step of the search's ladder: the nodes it leaves in float, those its step added, the op type fallen."""

    index: int
    excluded: list[str]
    new: list[str]
    op_type: str | None
    fallen: list[str] = field(default_factory=list)  # fallback op_types: the op types in float up to this rung, in order


@dataclass
class _Run:
    """One model measured: the quantized model, its metric, the rung it was made for."""

    result: PassResult
    value: float
    rung: _Rung
    seconds: dict[str, float]

    @property
    def excluded(self) -> list[str]:
        return self.rung.excluded

    def summary(self, iteration: int, met: bool) -> dict[str, Any]:
        rung = self.rung
        entry: dict[str, Any] = {
            "iteration": iteration,
            "rung": rung.index,
            "excluded": len(rung.excluded),
            "newly_excluded_count": len(rung.new),
            "newly_excluded": rung.new[:_NAMES_SHOWN],
            "metric": self.value,
            "met": met,
            "seconds": self.seconds,
        }
        if rung.op_type is not None and rung.index > 0:
            entry["op_type"] = rung.op_type
        return entry


def _next_op_type(
    order: list[tuple[str, float]], fallen: list[str | None], candidates: list[str], excluded: list[str], op_of: dict[str, str]
) -> tuple[list[str], str | None]:
    """The next op type of ``order`` with a candidate node not yet excluded, and all those nodes."""
    for op_type, _ in order:
        if op_type in fallen:
            continue
        nodes = [n for n in candidates if op_of.get(n) == op_type and n not in excluded]
        if nodes:
            return nodes, op_type
    return [], None


class _Quantize(OrtQuantize):
    """ort_quantize as this pass runs it: what to keep in float is this pass's search (the nodes
    around a mask's fill value included), not ort_quantize's fixed rule."""

    float_unresolvable = False
