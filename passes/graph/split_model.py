"""Split an ONNX model into parts that run one after the other (for NPUs that take a model in
pieces), as Olive's CaptureSplitInfo + SplitModel do: by transformer layer count
(``num_splits``), by explicit ``split_assignments`` {name prefix: part}, or by a weight budget
per part (``max_part_bytes``, what CaptureSplitInfo's cost model with the accelerator's memory
decides). Which node goes where: ``passes.graph._split_plan``.

The output is an ``onnx_parts`` folder: model_0.onnx, model_1.onnx... and split.json, the
manifest (the parts in order, each with its inputs and outputs; the whole model's inputs and
outputs). A part's inputs are the graph inputs it reads and the earlier parts' outputs it needs;
its outputs are the graph outputs it computes and the values a later part reads. Running the parts
in order, feeding each the values named in its inputs, computes the original model
(``compose_models`` joins them back).

A ``genai`` decoder folder keeps its tokenizer files and its genai_config.json becomes ONNX
Runtime GenAI's ``decoder-pipeline``: ``model.decoder.pipeline`` lists the parts (filename,
inputs, outputs, run on prompt and on token generation).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, PositiveInt, model_validator

from engine.core import ModelArtifact, Pass, PassConfig, PassContext, PassResult
from passes.common.onnx_io import check_onnx
from passes.graph import _split_plan as plan
from passes.graph._parts import MANIFEST, extract_parts, save_part, tensor_bytes, write_pipeline_config

if TYPE_CHECKING:
    import onnx


class SplitModel(Pass):
    name = "split_model"
    summary = "Split an ONNX model (or a genai decoder) into parts run in sequence: by layer count, by name prefixes, or by a weight budget per part."
    version = "1"
    accepts = ("onnx", "genai")
    produces = "onnx_parts"
    libraries = ("onnx",)

    class Config(PassConfig):
        num_splits: PositiveInt | None = Field(
            None,
            description="Split the transformer layers (nodes named ...layers.<i>... or ...layer.<i>...) into this many parts of "
            "consecutive layers (Olive CaptureSplitInfo's num_splits).",
        )
        split_assignments: dict[str, int] | None = Field(
            None,
            description="Part of each node name prefix, dotted ('model.layers.0': 0, 'model.layers.1': 1); a node takes its "
            "longest listed prefix (Olive SplitModel's split_assignments).",
        )
        max_part_bytes: PositiveInt | None = Field(
            None,
            description="Pack consecutive layers into parts whose weights (initializer bytes) stay within this budget (what Olive's "
            "CaptureSplitInfo decides from a cost model and the accelerator's memory). A layer larger than the budget is an error.",
        )
        unique_embeds_lm_head_splits: bool = Field(
            False,
            description="With num_splits: what comes before the first layer (embeddings, masks) and after the last (final norm, "
            "head) get parts of their own (Olive CaptureSplitInfo's option).",
        )

        @model_validator(mode="after")
        def _one_way(self) -> SplitModel.Config:
            given = [name for name in ("num_splits", "split_assignments", "max_part_bytes") if getattr(self, name) is not None]
            if len(given) != 1:
                raise ValueError(f"give exactly one of num_splits, split_assignments, max_part_bytes (given: {given or 'none'})")
            if self.unique_embeds_lm_head_splits and self.num_splits is None:
                raise ValueError("unique_embeds_lm_head_splits applies with num_splits only")
            if self.split_assignments is not None and any(part < 0 for part in self.split_assignments.values()):
                raise ValueError("split_assignments: parts are numbered from 0")
            return self

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        import onnx

        proto = onnx.load(str(model.model_file))
        node_parts, layers = self._assign(proto.graph)
        parts = extract_parts(proto, node_parts)
        out = Path(ctx.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        entries = []
        for index, (part, inputs, outputs) in enumerate(parts):
            file_name = save_part(part, out, index)
            part_layers = sorted({layer for layer, owners in zip(layers, node_parts, strict=True) if layer is not None and index in owners})
            entries.append(
                {
                    "name": f"part_{index}",
                    "file": file_name,
                    "inputs": inputs,
                    "outputs": outputs,
                    "nodes": len(part.graph.node),
                    "layers": part_layers,
                    "weight_bytes": sum(tensor_bytes(t) for t in part.graph.initializer),
                }
            )
        manifest = {
            "parts": entries,
            "inputs": [value.name for value in proto.graph.input if value.name not in {t.name for t in proto.graph.initializer}],
            "outputs": [value.name for value in proto.graph.output],
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        notes = []
        if model.format == "genai":
            notes.extend(write_pipeline_config(model, out, entries))
        details: dict[str, Any] = {
            "parts": len(entries),
            "layers": len({layer for layer in layers if layer is not None}),
            "part_nodes": [entry["nodes"] for entry in entries],
            "part_weight_bytes": [entry["weight_bytes"] for entry in entries],
            "part_layers": [entry["layers"] for entry in entries],
        }
        return PassResult(model=ModelArtifact.from_folder("onnx_parts", out, attrs=model.attrs), details=details, notes=notes)

    def _assign(self, graph: onnx.GraphProto) -> tuple[list[set[int]], list[int | None]]:
        """Each node's parts (numbered from 0, none empty) and each node's layer."""
        cfg = self.config
        layers = [plan.layer_of(node.name) for node in graph.node]
        if cfg.split_assignments is not None:
            seeds = [plan.assignment_of(node.name, cfg.split_assignments) for node in graph.node]
            if all(seed is None for seed in seeds):
                raise ValueError("split_assignments: no node name starts with any of the listed prefixes")
            return _renumber(plan.assign_nodes(graph, seeds, head_part=False)), layers
        ordered = sorted({layer for layer in layers if layer is not None})
        if not ordered:
            raise ValueError("no transformer layers found: no node name holds 'layers.<i>' or 'layer.<i>'; give split_assignments")
        if cfg.num_splits is not None:
            part_of = plan.chunk_layers(ordered, cfg.num_splits)
            shift = 1 if cfg.unique_embeds_lm_head_splits else 0
            seeds = [None if layer is None else part_of[layer] + shift for layer in layers]
            if cfg.unique_embeds_lm_head_splits:
                last = max(index for index, layer in enumerate(layers) if layer is not None)
                tail = cfg.num_splits + 1
                seeds = [tail if index > last and seed is None else seed for index, seed in enumerate(seeds)]
            return _renumber(plan.assign_nodes(graph, seeds, head_part=cfg.unique_embeds_lm_head_splits)), layers
        unit_of = {layer: unit for unit, layer in enumerate(ordered)}
        units = plan.assign_nodes(graph, [None if layer is None else unit_of[layer] for layer in layers], head_part=False)
        sizes = {tensor.name: tensor_bytes(tensor) for tensor in graph.initializer}
        weights: list[dict[str, int]] = [{} for _ in ordered]
        for node, node_units in zip(graph.node, units, strict=True):
            for unit in node_units:
                weights[unit].update({name: sizes[name] for name in plan.node_inputs(node) if name in sizes})
                if node.op_type == "Constant":
                    weights[unit][node.output[0]] = sum(tensor_bytes(a.t) for a in node.attribute if a.HasField("t"))
        assert cfg.max_part_bytes is not None
        part_of_unit = plan.pack_units(weights, cfg.max_part_bytes, [f"layer {layer}" for layer in ordered])
        return _renumber([{part_of_unit[unit] for unit in node_units} for node_units in units]), layers

    def check_output(self, result: PassResult, ctx: PassContext) -> None:
        super().check_output(result, ctx)
        folder = Path(result.model.path)
        manifest = json.loads((folder / MANIFEST).read_text())
        for entry in manifest["parts"]:
            check_onnx(folder / entry["file"])


def _renumber(node_parts: list[set[int]]) -> list[set[int]]:
    """Parts numbered 0, 1, ... in order, leaving out numbers no node took."""
    used = sorted(set().union(*node_parts))
    index = {part: new for new, part in enumerate(used)}
    return [{index[part] for part in parts} for parts in node_parts]
