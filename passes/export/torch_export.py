"""Export a Hugging Face folder or a PyTorch factory's module to ONNX, checked against torch."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, PositiveInt, field_validator

from engine.core import ModelArtifact, PassConfig, PassContext, PassResult
from passes.common.onnx_io import OnnxPass, default_opset, ort_limits, save_onnx
from passes.common.pass_io import check_providers
from passes.common.whole_model import check_whole, refuse_encoder_decoder_task
from passes.export.hf_options import AttnImplementation, Task, attn_implementation_field, task_field

if TYPE_CHECKING:
    from passes.export.sources import ExportSource

Dtype = Literal["float32", "float16", "int64", "int32", "bool"]


class TorchExport(OnnxPass):
    """Trace a model with torch's TorchScript or dynamo ONNX exporter, make the file reproducible
    (same input and config, same bytes), clamp it to what onnxruntime loads, and check that
    onnxruntime's outputs match torch's at two input sizes."""

    name = "torch_export"
    summary = "Export a Hugging Face or PyTorch model to ONNX and check onnxruntime matches torch."
    version = "1"
    accepts = ("hf", "torch")
    produces = "onnx"
    libraries = ("torch", "transformers", "onnx", "onnxscript")

    class Config(PassConfig):
        exporter: Literal["torchscript", "dynamo"] = Field(
            default="torchscript",
            description="torch's exporter: 'torchscript' (torch.jit tracing; the only export onnxruntime's BERT optimizer fuses attention in) "
            "or 'dynamo' (torch.export; writes opset 18 and converts down to `opset`).",
        )
        opset: int = Field(default=17, ge=7, description="ONNX opset to write; at most what the installed onnxruntime loads (26 for 1.31).")
        dynamic_axes: bool = Field(
            default=True,
            description="Make the batch axis of every input and output dynamic ('batch'), and for Hugging Face models the sequence axis "
            "too ('sequence') of a text model; false exports the example's fixed shapes.",
        )
        task: Task = task_field("Hugging Face task")
        attn_implementation: AttnImplementation = attn_implementation_field(
            "eager", "Hugging Face input only", " onnxruntime's attention fusion needs 'eager'."
        )
        outputs: tuple[str, ...] | None = Field(
            default=None,
            min_length=1,
            description="Outputs to export. Hugging Face: output fields, default ['last_hidden_state'] (feature-extraction), "
            "['logits', 'pred_boxes'] (object-detection) or ['logits']; "
            "torch: keys of a dict output, or names for a tensor / tuple output (default output, output_0, ...).",
        )
        input_shapes: dict[str, tuple[PositiveInt, ...]] | None = Field(
            default=None,
            description="torch models whose factory returns only a module: input name -> shape of the example input (batch first).",
        )
        input_dtypes: dict[str, Dtype] = Field(
            default_factory=dict,
            description="torch models: input name -> dtype of the example input named in input_shapes (default float32).",
        )
        parity_tolerance: float = Field(
            default=1e-3, gt=0, description="Largest absolute difference allowed between torch's and onnxruntime's outputs."
        )
        check_parity: bool = Field(
            default=True, description="Run the export in onnxruntime and compare it with torch; fail above parity_tolerance."
        )

        @field_validator("outputs")
        @classmethod
        def _distinct(cls, outputs: tuple[str, ...] | None) -> tuple[str, ...] | None:
            if outputs is not None and len(set(outputs)) != len(outputs):
                raise ValueError(f"names an output twice: {list(outputs)}")
            return outputs

    @classmethod
    def warm_modules(cls, input_format: str) -> tuple[str, ...]:
        # a Hugging Face model loads through transformers.modeling_utils (2 s of imports on its own);
        # onnxscript is the dynamo exporter's, imported by the job that asks for it
        return ("torch", "transformers", "transformers.modeling_utils", "onnx") if input_format == "hf" else ("torch", "onnx")

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        # torch, transformers and onnx take seconds to import: load them only when the pass runs
        from passes.export import exporters, parity

        config = self.config
        self._check_opset(exporters.torchscript_max_opset())
        source = self._source(model)

        cases = [parity.torch_case(source.module, source.example)]
        out_axes = None
        if config.dynamic_axes:
            try:
                cases.append(parity.torch_case(source.module, source.alternate))
            except RuntimeError as error:
                sizes = {label: pair[1] for label, pair in source.axis_sizes.items()}
                raise ValueError(
                    f"the model fails in torch at {sizes}, so its axes cannot be dynamic; set dynamic_axes: false ({error})"
                ) from error
            out_axes = exporters.output_axes(source, cases[0].outputs, cases[1].outputs)

        proto, warnings_seen = self._export(source, out_axes, cases[0].outputs, Path(ctx.workdir) / "export")
        path = save_onnx(proto, Path(ctx.output_dir))
        for warning in warnings_seen:
            ctx.logger.debug("%s: exporter warning: %s", ctx.step_id, warning)

        inputs = [value.name for value in proto.graph.input]
        outputs = [value.name for value in proto.graph.output]
        # the whole model the task needs: its main input (the exporter drops only unused others) and every output
        main = [name for name in ("input_ids", "pixel_values") if name in source.input_names][:1]
        check_whole(f"the {source.attrs.get('task', 'torch')} model", inputs, outputs, main, source.output_names)
        opset = default_opset(proto)
        notes = [*source.notes, f"exported with the {config.exporter} exporter at opset {opset}"]
        if opset != config.opset:
            notes.append(f"the {config.exporter} exporter wrote opset {opset}, not the {config.opset} asked for")
        unused = [name for name in source.input_names if name not in inputs]
        if unused:
            notes.append(f"the exporter dropped inputs the model does not use: {', '.join(unused)}")
        details = {
            "exporter": config.exporter,
            "opset": opset,
            "ir_version": proto.ir_version,
            "node_count": len(proto.graph.node),
            "inputs": exporters.describe_io(proto.graph.input),
            "outputs": exporters.describe_io(proto.graph.output),
            "export_warnings": [warning[:200] for warning in warnings_seen],
            "parity": None,
        }
        if config.check_parity:
            details["parity"] = parity.check(path, outputs, cases, config.parity_tolerance, check_providers(ctx))
        else:
            notes.append("parity with torch not checked (check_parity: false)")
        attrs = {**source.attrs, "inputs": inputs, "outputs": outputs}
        return PassResult(model=ModelArtifact.from_folder("onnx", Path(ctx.output_dir), attrs=attrs), details=details, notes=notes)

    def _export(
        self, source: ExportSource, out_axes: dict[str, dict[int, str]] | None, outputs: list[Any], scratch: Path
    ) -> tuple[Any, list[str]]:
        """The exported graph, reproducible (a vision model's output axes other than the batch fixed
        to the example's sizes), and the exporter's warnings; a failure names the model and the other exporter."""
        from passes.export import exporters

        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        try:
            proto, warnings_seen = exporters.export(source, self.config.exporter, self.config.opset, out_axes, scratch)
        except (RuntimeError, TypeError, NotImplementedError) as error:  # torch's exporters raise these (and subclasses)
            raise ValueError(exporters.failure(source, self.config.exporter, error)) from error
        shutil.rmtree(scratch)
        exporters.make_reproducible(proto)
        if out_axes is not None and "image_shape" in source.attrs:  # a fixed image size fixes every output axis but the batch
            exporters.fix_output_dims(proto, source.output_names, outputs, out_axes)
        return proto, warnings_seen

    def _check_opset(self, torchscript_max: int) -> None:
        _, max_opset = ort_limits()
        opset = self.config.opset
        if opset > max_opset:
            raise ValueError(
                f"opset {opset} is above {max_opset}, the highest opset the installed onnxruntime loads; set opset to {max_opset} or lower"
            )
        if self.config.exporter == "torchscript" and opset > torchscript_max:
            raise ValueError(
                f"the torchscript exporter writes opset {torchscript_max} at most, {opset} was asked for; use exporter: dynamo or a lower opset"
            )

    def _source(self, model: ModelArtifact) -> ExportSource:
        from passes.export import sources  # imports torch: loaded only when the pass runs

        config = self.config
        if model.format == "hf":
            if config.input_shapes or config.input_dtypes:
                raise ValueError(
                    "input_shapes and input_dtypes apply to torch models; a Hugging Face model's inputs come from its tokenizer "
                    "(text) or its image processor config (vision)"
                )
            if not (Path(model.path) / "config.json").is_file():
                raise ValueError(f"{model.path} is not a Hugging Face folder: it has no config.json")
            refuse_encoder_decoder_task(Path(model.path), config.task, self.name)
            return sources.hf_source(Path(model.path), config.task, config.attn_implementation, config.outputs, sources.remote_code(model))
        return sources.factory_source(model, config.input_shapes, dict(config.input_dtypes), config.outputs)
