"""Convert an ONNX, PyTorch or Hugging Face model (or re-write an IR) to OpenVINO IR.

- ONNX and IR are read with ``Core.read_model``; PyTorch factories and Hugging Face folders are
  loaded like ``torch_export`` loads them and traced by ``openvino.convert_model`` with their
  example inputs (the axes that may vary stay dynamic).
- ``input_shapes`` fixes input shapes (``model.reshape``); other inputs keep the source's dims.
- ``inference_precision_hint`` is written into the IR (see ``targets.openvino``), so "FP32 at
  f32" and "FP32 at bf16" are two artifacts with two digests, comparable as candidates.
- ``compress_to_fp16`` stores weights in FP16. It defaults to false here, while
  ``openvino.save_model`` defaults to true: an FP32 conversion should stay FP32 unless asked.
- The written IR is checked against its source at FP32 on random feeds (onnxruntime for ONNX,
  torch for PyTorch / Hugging Face, OpenVINO for IR), within ``parity_tolerance``.

openvino, torch and onnxruntime are imported inside ``run``: the engine imports this module when
it validates a workflow, only to read ``Config``, and that must stay fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from engine.core import Categorical, ModelArtifact, PassConfig, PassContext, PassResult
from passes.common.pass_io import check_providers
from passes.export.hf_options import AttnImplementation, Task, attn_implementation_field, task_field
from passes.openvino._base import PRECISION_HINT_DESCRIPTION, OpenVinoPass, PrecisionHint

if TYPE_CHECKING:
    import openvino as ov

    from passes.export.sources import ExportSource


class OpenVinoConvert(OpenVinoPass):
    name = "openvino_convert"
    summary = (
        "Convert ONNX, PyTorch or Hugging Face models to OpenVINO IR, with static shapes, FP16 weights or a precision hint; parity-checked."
    )
    version = "1"
    accepts = ("onnx", "openvino", "torch", "hf")
    produces = "openvino"
    libraries = ("openvino", "torch", "transformers")
    search_space = {"inference_precision_hint": Categorical(("f32", "device"))}

    class Config(PassConfig):
        inference_precision_hint: PrecisionHint | None = Field(default=None, description=PRECISION_HINT_DESCRIPTION)
        compress_to_fp16: bool = Field(
            default=False,
            description="Store weights as FP16 (half the file size; OpenVINO computes in its inference precision either way). "
            "openvino.save_model defaults to true; Kiln defaults to false so an FP32 model stays FP32 unless asked.",
        )
        input_shapes: dict[str, list[int]] | None = Field(
            default=None,
            description="Fixed input shapes, input name -> dims, e.g. {input_ids: [1, 128]}; -1 keeps a dim dynamic. "
            "Inputs not named keep the source's dims (dynamic where the source's are).",
        )
        task: Task = task_field("Hugging Face input only")
        attn_implementation: AttnImplementation = attn_implementation_field("sdpa", "Hugging Face input only")
        outputs: tuple[str, ...] | None = Field(
            default=None,
            min_length=1,
            description="PyTorch / Hugging Face input only: outputs to keep (default: last_hidden_state or logits; a factory's outputs).",
        )
        check_parity: bool = Field(default=True, description="Compare the written IR with its source at FP32; fail above parity_tolerance.")
        parity_tolerance: float = Field(default=1e-3, gt=0, description="Largest absolute output difference allowed by the parity check.")
        parity_int_high: int = Field(
            default=100,
            ge=1,
            description="Integer inputs of the parity feeds (token ids) are drawn from [0, parity_int_high): keep it within the vocabulary.",
        )

        @field_validator("input_shapes")
        @classmethod
        def _dims(cls, shapes: dict[str, list[int]] | None) -> dict[str, list[int]] | None:
            for name, dims in (shapes or {}).items():
                bad = [d for d in dims if d < 1 and d != -1]
                if bad:
                    raise ValueError(f"input_shapes[{name!r}] has dims {bad}: each dim is a size >= 1, or -1 for dynamic")
            return shapes

    config: Config

    @classmethod
    def warm_modules(cls, input_format: str) -> tuple[str, ...]:
        # torch and transformers only for the inputs that need them; a Hugging Face model loads
        # through transformers.modeling_utils (2 s of imports on its own)
        torch = {"torch": ("torch",), "hf": ("torch", "transformers", "transformers.modeling_utils")}.get(input_format, ())
        return ("targets.openvino_offline", "openvino", *torch)

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        # openvino, torch and onnxruntime take seconds to import: only when the pass runs. Telemetry
        # is declined before openvino is imported: its import sets up usage statistics
        from passes.openvino._quiet import decline_telemetry, library_output

        decline_telemetry()
        from passes.openvino import _ir

        cfg = self.config
        notes: list[str] = []
        source: ExportSource | None = None
        with library_output(nncf_level=100) as output:
            if model.format in ("onnx", "openvino"):
                self._reject_torch_options(model.format)
                ov_model = _ir.read_input(model)
            else:
                source = self._source(model)
                ov_model = self._convert_torch(source)
                notes.extend(source.notes)
            source_inputs = _ir.describe_io(ov_model.inputs, "input")
            reshaped = self._reshape(ov_model)
            # FP16 weights are a deliberate loss, judged by the workflow's evaluators: parity checks
            # the conversion on FP32 weights (a scratch copy) and records the FP16 copy's difference
            checked = _ir.save_ir(ov_model, Path(ctx.workdir) / "fp32", None) if cfg.compress_to_fp16 and cfg.check_parity else None
            xml = _ir.save_ir(ov_model, Path(ctx.output_dir), cfg.inference_precision_hint, cfg.compress_to_fp16)

            parity = self._parity(model, ctx, source, ov_model, xml, checked, notes)

        written = _ir.read_ir(xml)
        inputs = [port["name"] for port in _ir.describe_io(written.inputs, "input")]
        outputs = [port["name"] for port in _ir.describe_io(written.outputs, "output")]
        details: dict[str, Any] = {
            "source_format": model.format,
            "inference_precision_hint": cfg.inference_precision_hint,
            "compress_to_fp16": cfg.compress_to_fp16,
            "source_inputs": source_inputs,
            "inputs": _ir.describe_io(written.inputs, "input"),
            "outputs": _ir.describe_io(written.outputs, "output"),
            "reshaped": reshaped,
            "node_count": len(written.get_ops()),
            "op_counts": _ir.op_counts(written),
            "weight_bytes": _ir.weight_bytes(written),
            "file_bytes": {"model.xml": xml.stat().st_size, "model.bin": xml.with_suffix(".bin").stat().st_size},
            "parity": parity,
            "library_warnings": output.lines(),
        }
        attrs = {**model.attrs, **(source.attrs if source else {}), "inputs": inputs, "outputs": outputs}
        return PassResult(model=ModelArtifact.from_folder("openvino", Path(ctx.output_dir), attrs=attrs), details=details, notes=notes)

    def _parity(
        self,
        model: ModelArtifact,
        ctx: PassContext,
        source: ExportSource | None,
        ov_model: ov.Model,
        xml: Path,
        checked: Path | None,
        notes: list[str],
    ) -> dict[str, Any] | None:
        """The written IR compared with its source (``checked``: its FP32-weights copy, when the
        IR's weights are FP16); None when parity is not checked."""
        from passes.openvino import _parity

        cfg = self.config
        if not cfg.check_parity:
            notes.append("parity with the source not checked (check_parity: false)")
            return None
        runner, against = self._reference(model, ctx, source, ov_model)
        parity = _parity.check(runner, against, checked or xml, cfg.parity_tolerance, cfg.parity_int_high)
        if checked is not None:
            parity["fp16_weights_max_abs_diff"] = _parity.check(runner, against, xml, float("inf"), cfg.parity_int_high)["max_abs_diff"]
            notes.append(
                f"weights stored in FP16: outputs differ from the source by up to {parity['fp16_weights_max_abs_diff']:.3g} "
                "(not held to parity_tolerance, which checked the conversion with FP32 weights)"
            )
        return parity

    def _reject_torch_options(self, fmt: str) -> None:
        if self.config.outputs is not None:
            raise ValueError(f"the option outputs applies to PyTorch and Hugging Face inputs; this input is {fmt}")

    def _source(self, model: ModelArtifact) -> ExportSource:
        from passes.export import sources  # imports torch: only for PyTorch / Hugging Face inputs

        cfg = self.config
        if model.format == "hf":
            if not (Path(model.path) / "config.json").is_file():
                raise ValueError(f"{model.path} is not a Hugging Face folder: it has no config.json")
            return sources.hf_source(Path(model.path), cfg.task, cfg.attn_implementation, cfg.outputs, sources.remote_code(model))
        try:
            return sources.factory_source(model, None, {}, cfg.outputs)
        except ValueError as error:
            static = {name: tuple(dims) for name, dims in (cfg.input_shapes or {}).items() if all(d > 0 for d in dims)}
            if "returns no example inputs" not in str(error):
                raise
            if not static:
                raise ValueError(
                    "the factory returns no example inputs: return (module, {input name: tensor}) from it, "
                    "or give static input_shapes for every input (float32 examples are made from them)"
                ) from error
            return sources.factory_source(model, static, {}, cfg.outputs)

    def _convert_torch(self, source: ExportSource) -> ov.Model:
        import openvino as ov

        shapes = [
            ov.PartialShape([-1 if axis in source.input_axes.get(name, {}) else size for axis, size in enumerate(tensor.shape)])
            for name, tensor in source.example.items()
        ]
        ov_model = ov.convert_model(source.module, example_input=tuple(source.example.values()), input=shapes)
        if len(ov_model.inputs) != len(source.input_names):
            raise ValueError(f"OpenVINO's converter kept {len(ov_model.inputs)} of the inputs {source.input_names}")
        if len(ov_model.outputs) != len(source.output_names):
            raise ValueError(f"OpenVINO's converter made {len(ov_model.outputs)} outputs for {source.output_names}")
        for port, name in zip(ov_model.inputs, source.input_names, strict=True):
            port.get_tensor().set_names({name})
        for port, name in zip(ov_model.outputs, source.output_names, strict=True):
            port.get_tensor().set_names({name})
        return ov_model

    def _reshape(self, ov_model: ov.Model) -> dict[str, list[int]] | None:
        shapes = self.config.input_shapes
        if not shapes:
            return None
        from targets.openvino import port_name

        names = [port_name(p, i, "input") for i, p in enumerate(ov_model.inputs)]
        unknown = [name for name in shapes if name not in names]
        if unknown:
            raise ValueError(f"input_shapes names inputs {unknown} the model does not have; its inputs: {names}")
        for name, dims in shapes.items():
            rank = ov_model.input(name).get_partial_shape().rank
            if rank.is_static and rank.get_length() != len(dims):
                raise ValueError(f"input_shapes[{name!r}] has {len(dims)} dims; the input has {rank.get_length()}")
        try:
            ov_model.reshape({name: dims for name, dims in shapes.items()})
        except RuntimeError as error:
            raise ValueError(f"OpenVINO could not reshape the model to {shapes}: {str(error).strip().splitlines()[-1]}") from error
        return dict(shapes)

    def _reference(self, model: ModelArtifact, ctx: PassContext, source: ExportSource | None, ov_model: ov.Model) -> tuple[Any, str]:
        from passes.openvino import _parity

        if source is not None:
            return _parity.torch_runner(source.module, source.input_names), "torch"
        if model.format == "onnx":
            outputs = [spec.name for spec in _parity.specs(ov_model.outputs, "output")]
            return _parity.onnx_runner(model.model_file, outputs, check_providers(ctx)), "onnxruntime"
        runner, _, _ = _parity.ir_runner(model.model_file)
        return runner, "the input IR"
