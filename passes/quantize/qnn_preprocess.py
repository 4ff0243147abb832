"""onnxruntime's preparation of a float model for QNN quantization (Olive's ``QNNPreprocess``):
``onnxruntime.quantization.execution_providers.qnn.qnn_preprocess_model``. It runs anywhere
onnxruntime does (no QNN SDK): it fuses Erf-based GELU into ``Gelu``, the ReduceMean sequence of a
layer norm into ``LayerNormalization`` (``fuse_layernorm``), splits a MatMul+Add into Gemm where
QNN wants it, removes initializers from the graph inputs when asked, and makes the named inputs or
outputs channel-last with a Transpose beside them (which may cancel the ones QNN's layout
transformation inserts). When nothing changes, the model is written as it was.
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import Field

from engine.core import ModelArtifact, PassConfig, PassContext, PassResult
from passes.common.graph_tools import op_delta, qualified_op_counts, runtime_loadable
from passes.common.onnx_io import OnnxPass, save_onnx
from passes.common.pass_io import onnx_output, require


class QnnPreprocess(OnnxPass):
    name = "qnn_preprocess"
    summary = (
        "Prepare a float model for QNN quantization with onnxruntime's qnn_preprocess_model (Olive's QNNPreprocess): "
        "GELU and layer-norm fusions, channel-last inputs and outputs."
    )
    version = "1"
    accepts = ("onnx",)
    produces = "onnx"
    libraries = ("onnxruntime", "onnx")

    class Config(PassConfig):
        fuse_layernorm: bool = Field(False, description="Fuse the ReduceMean sequence of a layer norm into one LayerNormalization node.")
        inputs_to_make_channel_last: list[str] | None = Field(
            None, description="Graph inputs made channel-last ((N, C, D1..Dn) -> (N, D1..Dn, C)) with a Transpose after each."
        )
        outputs_to_make_channel_last: list[str] | None = Field(
            None, description="Graph outputs made channel-last with a Transpose before each."
        )
        exclude_initializer_from_input: bool = Field(False, description="Remove initializers from the graph's inputs.")

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        import onnx

        (qnn,) = require("onnxruntime", self.name, "onnxruntime.quantization.execution_providers.qnn")
        cfg = self.config
        workdir = Path(ctx.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        source = runtime_loadable(model.model_file, workdir)
        scratch = workdir / "preprocessed.onnx"
        started = time.perf_counter()
        modified = qnn.qnn_preprocess_model(
            str(source),
            str(scratch),
            exclude_initializer_from_input=cfg.exclude_initializer_from_input,
            fuse_layernorm=cfg.fuse_layernorm,
            inputs_to_make_channel_last=cfg.inputs_to_make_channel_last,
            outputs_to_make_channel_last=cfg.outputs_to_make_channel_last,
        )
        seconds = round(time.perf_counter() - started, 3)
        before = onnx.load(str(model.model_file))
        after = onnx.load(str(scratch)) if modified else before
        save_onnx(after, Path(ctx.output_dir))
        counts_in, counts_out = qualified_op_counts(before), qualified_op_counts(after)
        details = {"modified": bool(modified), "op_delta": op_delta(counts_in, counts_out), "seconds": seconds}
        notes = [] if modified else ["qnn_preprocess_model changed nothing: the model is written as it was"]
        return onnx_output(model, ctx, details, notes)
