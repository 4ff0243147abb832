"""Wrap an OpenVINO IR in an ONNX model for ONNX Runtime's OpenVINO execution provider (Olive's
OpenVINOEncapsulation): one ``EPContext`` node (domain ``com.microsoft``) whose
``ep_cache_context`` names the IR file beside it.

The output folder holds ``model.onnx`` (the context model), ``model.xml`` and ``model.bin`` (the
IR, unchanged). The node's attributes are Olive's: ``embed_mode`` 0 (the IR is a file next to the
model, not embedded), ``source`` OpenVINOExecutionProvider, ``main_context`` 1, ``max_size`` 0,
``ep_sdk_version`` (``ov_version``, else this environment's OpenVINO version) and ``DeviceClass``
(the target device, upper case). The graph's inputs and outputs are the IR's, with the IR's
element types; a dynamic dim becomes the dim parameter ``input_<i>_<j>`` / ``output_<i>_<j>``, or
-1 with ``keep_ov_dynamic_dims`` (Olive's spelling of both). The model declares Olive's opset
imports and IR version 10.

Only ONNX Runtime's OpenVINO execution provider runs such a model: stock onnxruntime has no kernel
for an EPContext node from this source. docs/targets.md says what the onnxruntime-openvino wheel
does with it on this project's hosts. Olive's ``genai_config_override`` (a genai_config.json for
ONNX Runtime GenAI) has no equivalent here: the folder holds the model only.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from engine.core import ModelArtifact, Pass, PassConfig, PassContext, PassResult
from passes.openvino._base import MODEL_FILE, WEIGHTS_FILE

ONNX_FILE = "model.onnx"
#: Olive's opset imports of the context model (olive.passes.openvino.encapsulation)
OLIVE_OPSETS: tuple[tuple[str, int], ...] = (
    ("com.microsoft.nchwc", 1),
    ("", 11),
    ("ai.onnx.ml", 5),
    ("com.ms.internal.nhwc", 11),
    ("ai.onnx.training", 1),
    ("ai.onnx.preview.training", 1),
    ("com.microsoft.experimental", 1),
    ("com.microsoft", 1),
    ("org.pytorch.aten", 1),
)
#: OpenVINO element types → ONNX TensorProto names
_ONNX_TYPES = {
    "f32": "FLOAT",
    "f64": "DOUBLE",
    "f16": "FLOAT16",
    "bf16": "BFLOAT16",
    "i8": "INT8",
    "i16": "INT16",
    "i32": "INT32",
    "i64": "INT64",
    "u8": "UINT8",
    "u16": "UINT16",
    "u32": "UINT32",
    "u64": "UINT64",
    "boolean": "BOOL",
}


class OpenVinoEncapsulate(Pass):
    name = "openvino_encapsulate"
    summary = "Wrap an OpenVINO IR in an ONNX EPContext model for ONNX Runtime's OpenVINO execution provider."
    version = "1"
    accepts = ("openvino",)
    produces = "onnx"
    libraries = ("openvino", "onnx")

    class Config(PassConfig):
        target_device: Literal["cpu", "gpu", "npu"] = Field(
            default="cpu", description="The OpenVINO device the model is for, written as the node's DeviceClass (upper case)."
        )
        ov_version: str | None = Field(
            default=None,
            min_length=1,
            description="The node's ep_sdk_version; null writes the OpenVINO version of the environment the pass runs in.",
        )
        keep_ov_dynamic_dims: bool = Field(
            default=False,
            description="Write a dynamic dim as -1; false names it input_<i>_<j> / output_<i>_<j> (a dim parameter).",
        )
        opset_imports: list[tuple[str, int]] = Field(
            default_factory=lambda: list(OLIVE_OPSETS),
            min_length=1,
            description="The context model's opset imports, [domain, version] pairs ('' is the default domain); Olive's by default.",
        )

    config: Config

    @classmethod
    def warm_modules(cls, input_format: str) -> tuple[str, ...]:
        return ("targets.openvino_offline", "openvino", "onnx")

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        from passes.openvino._quiet import decline_telemetry

        decline_telemetry()
        import onnx
        import openvino as ov

        from passes.openvino import _ir

        cfg = self.config
        ov_model = _ir.read_input(model)
        version = cfg.ov_version or ov.get_version()
        out = Path(ctx.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name in (MODEL_FILE, WEIGHTS_FILE):  # the IR as it is: the EP reads these very files
            _copy_atomic(Path(model.path) / name, out / name)
        context = context_model(ov_model, version, cfg.target_device, cfg.keep_ov_dynamic_dims, cfg.opset_imports, model.model_file)
        temporary = out / f".{ONNX_FILE}.{os.getpid()}.tmp"
        onnx.save(context, str(temporary))
        os.replace(temporary, out / ONNX_FILE)
        inputs = [value.name for value in context.graph.input]
        outputs = [value.name for value in context.graph.output]
        details: dict[str, Any] = {
            "ep_sdk_version": version,
            "device_class": cfg.target_device.upper(),
            "embed_mode": 0,
            "inputs": _ir.describe_io(ov_model.inputs, "input"),
            "outputs": _ir.describe_io(ov_model.outputs, "output"),
            "ir_bytes": {MODEL_FILE: (out / MODEL_FILE).stat().st_size, WEIGHTS_FILE: (out / WEIGHTS_FILE).stat().st_size},
        }
        attrs = {**model.attrs, "inputs": inputs, "outputs": outputs, "ep": "OpenVINOExecutionProvider", "device": cfg.target_device}
        notes = ["runs on ONNX Runtime's OpenVINO execution provider only (an EPContext node wrapping the IR)"]
        return PassResult(model=ModelArtifact.from_folder("onnx", out, attrs=attrs), details=details, notes=notes)

    def check_output(self, result: PassResult, ctx: PassContext) -> None:
        super().check_output(result, ctx)
        import onnx

        folder = Path(result.model.path)
        context = onnx.load(str(folder / ONNX_FILE))
        (node,) = context.graph.node
        cache = next(a.s.decode() for a in node.attribute if a.name == "ep_cache_context")
        if not (folder / cache).is_file() or not (folder / cache).with_suffix(".bin").is_file():
            raise ValueError(f"the EPContext node names {cache}, which is not beside {ONNX_FILE} with its weights")


def context_model(ov_model: Any, version: str, device: str, keep_dynamic: bool, opsets: list[tuple[str, int]], where: Path) -> Any:
    """The ONNX model of one EPContext node over ``ov_model``'s inputs and outputs."""
    from onnx import TensorProto, helper

    from targets.openvino import port_name

    def values(ports: Any, kind: str) -> list[Any]:
        made = []
        for i, port in enumerate(ports):
            element = port.get_element_type().get_type_name()
            if element not in _ONNX_TYPES:
                raise ValueError(f"{where.name}: {kind} {i} has element type {element}, which has no ONNX type ({', '.join(_ONNX_TYPES)})")
            shape = port.get_partial_shape()
            if shape.rank.is_dynamic:
                raise ValueError(f"{where.name}: {kind} {i} has a dynamic rank; the context model needs one dim per axis")
            dims = [d.get_length() if d.is_static else (-1 if keep_dynamic else f"{kind}_{i}_{j}") for j, d in enumerate(shape)]
            made.append(helper.make_tensor_value_info(port_name(port, i, kind), getattr(TensorProto, _ONNX_TYPES[element]), dims))
        return made

    inputs, outputs = values(ov_model.inputs, "input"), values(ov_model.outputs, "output")
    node = helper.make_node(
        "EPContext",
        inputs=[v.name for v in inputs],
        outputs=[v.name for v in outputs],
        name="ContextNode",
        domain="com.microsoft",
        embed_mode=0,
        ep_cache_context=MODEL_FILE,
        ep_sdk_version=version,
        main_context=1,
        max_size=0,
        source="OpenVINOExecutionProvider",
        DeviceClass=device.upper(),
    )
    graph = helper.make_graph([node], "EP_Context_Model", inputs, outputs)
    context = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, version) for domain, version in opsets])
    context.ir_version = 10  # Olive's
    return context


def _copy_atomic(source: Path, target: Path) -> None:
    if not source.is_file():
        raise ValueError(f"the input IR has no {source.name} (looked in {source.parent})")
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.copyfile(source, temporary)
    os.replace(temporary, target)
