"""Float16 conversion with onnxruntime's converter (``onnxruntime.transformers.float16``, the
same code as onnxconverter-common's, shipped with onnxruntime).

A GPU pass. ONNX Runtime's CPU provider has few float16 kernels: it runs the model by inserting
casts back to float32 around most nodes, so FP16 on CPU gains nothing and usually costs time.
Measure it on a CPU only to see what it costs; the file does halve.

The conversion goes through ``OnnxModel.convert_float_to_float16`` (type information from
symbolic shape inference, which knows onnxruntime's fused contrib ops, so fused models convert;
cascaded and useless Cast nodes removed afterwards), then a topological sort: with
``keep_io_types`` the converter appends its input casts at the end of the node list, which
onnx.checker rejects.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from engine.core import Categorical, ModelArtifact, PassConfig, PassContext, PassResult
from passes.common.graph_tools import add_contrib_opset, op_delta, qualified_op_counts, quiet_library
from passes.common.onnx_io import OnnxPass, save_onnx
from passes.common.pass_io import onnx_output, require

_FLOAT, _FLOAT16 = 1, 10  # onnx.TensorProto.FLOAT / FLOAT16, without importing onnx here


class Fp16(OnnxPass):
    name = "fp16"
    summary = (
        "Convert float32 weights and compute to float16 (onnxruntime's converter). A GPU pass: FP16 on ONNX Runtime's CPU "
        "provider gains nothing: it inserts casts back; measure it on CPU only to see what it costs."
    )
    version = "1"
    accepts = ("onnx", "genai")
    produces = "onnx"
    keeps = ("genai",)  # a decoder folder stays one (for GPU targets): genai_config.json and the tokenizer are copied
    libraries = ("onnx", "onnxruntime")
    search_space = {"keep_io_types": Categorical((True, False))}

    class Config(PassConfig):
        keep_io_types: bool = Field(
            False,
            description=(
                "Keep float32 graph inputs and outputs (Cast nodes at the edges) so callers feed and read float32. "
                "false (the converters' default, kept explicit here): float inputs and outputs become float16 and callers must feed float16."
            ),
        )
        op_block_list: list[str] | None = Field(
            None,
            description=(
                "Op types to keep in float32. null = onnxruntime's default list (float16.DEFAULT_OP_BLOCK_LIST: ML ops, "
                "TopK, Range, CumSum, Min, Max, Upsample, NonMaxSuppression, RoiAlign...), recorded in the details. "
                "A list replaces the default; [] converts every op."
            ),
        )
        node_block_list: list[str] = Field(
            default_factory=list,
            description="Names of nodes to keep in float32 (e.g. a final Softmax or a LayerNorm that overflows). An unknown name is an error.",
        )
        min_positive_val: float = Field(
            5.96e-08,
            gt=0,
            description="Weights whose magnitude is below this (but not zero) are raised to it instead of flushing to zero (default: the smallest float16 subnormal).",
        )
        max_finite_val: float = Field(
            65504.0,
            gt=0,
            le=65504.0,
            description="Weights whose magnitude is above this are clipped to it (default: the largest finite float16).",
        )
        force_fp16_initializers: bool = Field(
            False, description="Convert float initializers that only blocked (float32) nodes read too, saving space at the price of a Cast."
        )
        symbolic_shape_inference: bool = Field(
            True,
            description="Get the tensor types from symbolic shape inference (handles onnxruntime contrib ops of fused models) instead of onnx's.",
        )

        @field_validator("node_block_list", "op_block_list")
        @classmethod
        def _distinct(cls, names: list[str] | None) -> list[str] | None:
            if names is not None and len(set(names)) != len(names):
                raise ValueError(f"names an entry twice: {names}")
            return sorted(names) if names is not None else None

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        # onnx and onnxruntime take a second to import: load them only when the pass runs (the
        # engine imports pass modules when it validates a workflow)
        import onnx

        float16, onnx_model = require("onnxruntime", self.name, "onnxruntime.transformers.float16", "onnxruntime.transformers.onnx_model")
        from passes.quantize.onnx_facts import initializer_bytes, node_names

        cfg = self.config
        source = onnx.load(str(model.model_file))
        unknown = sorted(set(cfg.node_block_list) - node_names(source))
        if unknown:
            raise ValueError(f"node_block_list: the model has no node named {', '.join(unknown)}")
        counts_in = qualified_op_counts(source)
        bytes_in = initializer_bytes(source)
        float_inits_in = sum(1 for t in source.graph.initializer if t.data_type == _FLOAT)
        op_block_list = list(float16.DEFAULT_OP_BLOCK_LIST) if cfg.op_block_list is None else list(cfg.op_block_list)

        started = time.perf_counter()
        with quiet_library() as messages:
            converter = onnx_model.OnnxModel(source)
            converter.convert_float_to_float16(
                use_symbolic_shape_infer=cfg.symbolic_shape_inference,
                keep_io_types=cfg.keep_io_types,
                op_block_list=op_block_list,
                node_block_list=list(cfg.node_block_list),
                min_positive_val=cfg.min_positive_val,
                max_finite_val=cfg.max_finite_val,
                force_fp16_initializers=cfg.force_fp16_initializers,
            )
            converter.topological_sort()
        seconds = round(time.perf_counter() - started, 3)
        output = converter.model
        add_contrib_opset(output)
        out_file = save_onnx(output, Path(ctx.output_dir))
        before = {"counts": counts_in, "initializer_bytes": bytes_in, "float32_initializers": float_inits_in}
        details, notes = self._details(model, source, before, output, out_file, op_block_list, messages, seconds)
        ctx.logger.debug("fp16 %s: %d -> %d initializer bytes", ctx.step_id, bytes_in, details["initializer_bytes_after"])
        return onnx_output(model, ctx, details, notes)

    def _details(
        self,
        model: ModelArtifact,
        source: Any,
        before: dict[str, Any],
        output: Any,
        out_file: Path,
        op_block_list: list[str],
        messages: list[str],
        seconds: float,
    ) -> tuple[dict[str, Any], list[str]]:
        from passes.quantize.onnx_facts import file_bytes, initializer_bytes

        cfg = self.config
        counts_in, bytes_in, float_inits_in = before["counts"], before["initializer_bytes"], before["float32_initializers"]
        counts_out = qualified_op_counts(output)
        notes = [
            "FP16 is a GPU pass: on ONNX Runtime's CPU provider it gains nothing (casts are inserted back to float32); "
            "a CPU measurement shows only what it costs"
        ]
        if not float_inits_in and not any(_elem_type(v) == _FLOAT for v in source.graph.input):
            notes.append("the model has no float32 weights or inputs: nothing to convert")
        details: dict[str, Any] = {
            "keep_io_types": cfg.keep_io_types,
            "op_block_list": op_block_list,
            "node_block_list": list(cfg.node_block_list),
            "blocked_nodes_present": {op: counts_in[op] for op in op_block_list if counts_in.get(op)},
            "initializer_bytes_before": bytes_in,
            "initializer_bytes_after": initializer_bytes(output),
            "float32_initializers_before": float_inits_in,
            "float32_initializers_after": sum(1 for t in output.graph.initializer if t.data_type == _FLOAT),
            "float16_initializers_after": sum(1 for t in output.graph.initializer if t.data_type == _FLOAT16),
            "inputs": {v.name: _type_name(v) for v in output.graph.input},
            "outputs": {v.name: _type_name(v) for v in output.graph.output},
            "casts_before": counts_in.get("Cast", 0),
            "casts_after": counts_out.get("Cast", 0),
            "nodes_before": sum(counts_in.values()),
            "nodes_after": sum(counts_out.values()),
            "op_delta": op_delta(counts_in, counts_out),
            "size_bytes_before": file_bytes(model.model_file),
            "size_bytes_after": file_bytes(out_file),
            "library_warnings": messages,
            "seconds": seconds,
        }
        return details, notes


def _elem_type(value: Any) -> int:
    return int(value.type.tensor_type.elem_type)


def _type_name(value: Any) -> str:
    import onnx

    elem = _elem_type(value)
    return onnx.helper.tensor_dtype_to_np_dtype(elem).name if elem else "undefined"
