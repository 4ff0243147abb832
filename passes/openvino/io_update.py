"""Give an OpenVINO IR the static shapes and I/O names ONNX Runtime's OpenVINO execution provider
expects (Olive's OpenVINOIoUpdate).

- Every input and output without a tensor name gets one: ``input_<i>`` / ``output_<i>``
  (``openvino_encapsulate`` names the EPContext node's inputs and outputs after them).
- ``input_names`` renames the inputs by position (as many names as the model has inputs).
- ``static: true`` reshapes the model with ``input_shapes``, one list of dims per input, by
  position (``model.reshape``); ``-1`` keeps a dim dynamic, as in ``openvino.PartialShape``.

The IR is written with the input's precision hint, through ``_ir.save_ir`` (reproducible bytes).
Olive's ``reuse_cache`` (write over the input's folder) has no equivalent: Kiln's store keeps
every step's output and shares identical files by content. Olive also copies a GenAI folder's
JSON files and tokenizer IRs along; Kiln's ``openvino`` format is one IR alone in its folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from engine.core import ModelArtifact, PassConfig, PassContext, PassResult
from passes.openvino._base import OpenVinoPass


class OpenVinoIoUpdate(OpenVinoPass):
    name = "openvino_io_update"
    summary = "Name every input and output of an OpenVINO IR and optionally fix its input shapes (for ONNX Runtime's OpenVINO EP)."
    version = "1"
    accepts = ("openvino",)
    produces = "openvino"
    libraries = ("openvino",)

    class Config(PassConfig):
        static: bool = Field(default=False, description="Reshape the model to input_shapes (static dims); false keeps its shapes.")
        input_shapes: list[list[int]] | None = Field(
            default=None,
            description="With static: one list of dims per input, in the model's input order, e.g. [[1, 128], [1, 128]]; "
            "-1 keeps a dim dynamic.",
        )
        input_names: list[str] | None = Field(
            default=None, min_length=1, description="New names of the inputs, in the model's input order (one per input)."
        )

        @model_validator(mode="after")
        def _shapes(self) -> OpenVinoIoUpdate.Config:
            if self.static and not self.input_shapes:
                raise ValueError("static: true needs input_shapes (one list of dims per input, in input order)")
            if self.input_shapes and not self.static:
                raise ValueError("input_shapes is applied only with static: true; set static: true or drop input_shapes")
            for i, dims in enumerate(self.input_shapes or []):
                bad = [d for d in dims if d < 1 and d != -1]
                if bad:
                    raise ValueError(f"input_shapes[{i}] has dims {bad}: each dim is a size >= 1, or -1 for dynamic")
            if self.input_names and len(set(self.input_names)) != len(self.input_names):
                raise ValueError(f"input_names {self.input_names} repeats a name")
            return self

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        from passes.openvino._quiet import decline_telemetry

        decline_telemetry()
        import openvino as ov

        from passes.openvino import _ir

        cfg = self.config
        ov_model = _ir.read_input(model)
        before = {"inputs": _ir.describe_io(ov_model.inputs, "input"), "outputs": _ir.describe_io(ov_model.outputs, "output")}
        named = name_ports(ov_model, cfg.input_names, model.model_file)
        if cfg.static and cfg.input_shapes:
            if len(cfg.input_shapes) != len(ov_model.inputs):
                raise ValueError(
                    f"{model.model_file.name} has {len(ov_model.inputs)} inputs; input_shapes gives {len(cfg.input_shapes)} "
                    f"shapes: give one list of dims per input, in this order: {[p['name'] for p in before['inputs']]}"
                )
            try:
                ov_model.reshape({ov_model.input(i): ov.PartialShape(dims) for i, dims in enumerate(cfg.input_shapes)})
            except RuntimeError as error:
                message = str(error).strip().splitlines()[-1]
                raise ValueError(f"OpenVINO could not reshape the model to input_shapes {cfg.input_shapes}: {message}") from error
        xml = _ir.save_ir(ov_model, Path(ctx.output_dir), _ir.input_hint(model, ov_model))
        written = _ir.read_ir(xml)
        inputs = _ir.describe_io(written.inputs, "input")
        outputs = _ir.describe_io(written.outputs, "output")
        details: dict[str, Any] = {"before": before, "inputs": inputs, "outputs": outputs, "named": named, "static": cfg.static}
        attrs = {**model.attrs, "inputs": [p["name"] for p in inputs], "outputs": [p["name"] for p in outputs]}
        notes = [f"named {len(named)} unnamed port(s): {', '.join(named)}"] if named else []
        return PassResult(model=ModelArtifact.from_folder("openvino", Path(ctx.output_dir), attrs=attrs), details=details, notes=notes)


def name_ports(ov_model: Any, input_names: list[str] | None, where: Path) -> list[str]:
    """Rename the inputs to ``input_names`` (by position) and name every unnamed port
    ``input_<i>`` / ``output_<i>``, as Olive does; returns the names given to unnamed ports."""
    if input_names is not None and len(input_names) != len(ov_model.inputs):
        raise ValueError(
            f"{where.name} has {len(ov_model.inputs)} inputs; input_names gives {len(input_names)} names: give one per input, in order"
        )
    given = []
    for i, port in enumerate(ov_model.inputs):
        if input_names is not None:
            port.get_tensor().set_names({input_names[i]})
        elif not port.get_names():
            port.get_tensor().set_names({f"input_{i}"})
            given.append(f"input_{i}")
    for i, port in enumerate(ov_model.outputs):
        if not port.get_names():
            port.get_tensor().set_names({f"output_{i}"})
            given.append(f"output_{i}")
    return given
