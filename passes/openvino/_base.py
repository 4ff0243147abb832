"""What the OpenVINO passes share at import time: the base class and config pieces.

Light on purpose (pydantic only): the engine imports pass modules when it validates a workflow,
and ``engine --help`` must stay fast. openvino and nncf are imported inside functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, Field

from engine.core import Pass, PassConfig, PassContext, PassResult, StrictConfig
from engine.core.refs import DatasetRef

if TYPE_CHECKING:
    import openvino as ov

PrecisionHint = Literal["f32", "bf16", "f16", "device"]
MODEL_FILE = "model.xml"
WEIGHTS_FILE = "model.bin"

PRECISION_HINT_DESCRIPTION = (
    "INFERENCE_PRECISION_HINT written into the IR (rt_info runtime_options), applied by the openvino target unless the target pins "
    "its own: f32, bf16 (the CPU default where the CPU supports it), f16, or device (no hint: the device's default precision). "
    "null writes none: the target then runs the model at its reference_precision_hint (f32 by default). Two values give two "
    "different artifacts, so they can be compared as candidates."
)


class IgnoredScope(StrictConfig):
    """nncf.IgnoredScope: nodes NNCF leaves in floating point."""

    # `validate` is nncf's name for the flag, but it would shadow BaseModel.validate: the field is
    # validate_names, read and written as `validate`
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, populate_by_name=True, serialize_by_alias=True)

    names: list[str] = Field(default_factory=list, description="Node names (friendly names in the IR) to leave alone.")
    types: list[str] = Field(default_factory=list, description="OpenVINO op types to leave alone, e.g. [Add, Multiply].")
    patterns: list[str] = Field(default_factory=list, description="Regular expressions matched against node names.")
    validate_names: bool = Field(
        default=True,
        alias="validate",
        description="Fail when a name, type or pattern matches nothing in the model (nncf's `validate`).",
    )

    def is_empty(self) -> bool:
        return not (self.names or self.types or self.patterns)

    def to_nncf(self) -> Any:
        import nncf  # heavy: only when the pass runs

        return nncf.IgnoredScope(names=list(self.names), types=list(self.types), patterns=list(self.patterns), validate=self.validate_names)


class OpenVinoPass(Pass):
    """Base of passes that write OpenVINO IR: the output must be ``model.xml`` + ``model.bin``
    alone in its folder, and read back in OpenVINO."""

    produces = "openvino"

    @classmethod
    def warm_modules(cls, input_format: str) -> tuple[str, ...]:
        return ("targets.openvino_offline", *cls.libraries)  # telemetry declined before openvino or nncf is imported

    def check_output(self, result: PassResult, ctx: PassContext) -> None:
        super().check_output(result, ctx)
        import openvino as ov  # heavy: only once the pass has run

        xml = result.model.model_file
        if not xml.with_suffix(".bin").exists():
            raise ValueError(f"the weights file {WEIGHTS_FILE} was not written next to {xml.name}")
        extra = sorted(p.name for p in Path(result.model.path).iterdir() if p.name not in (MODEL_FILE, WEIGHTS_FILE))
        if extra:
            raise ValueError(f"the output folder holds files besides the model: {', '.join(extra)}")
        ov.Core().read_model(str(xml))


def check_outputs_kept(before: ov.Model, after: ov.Model) -> None:
    """Raise if a pass lost or renamed the model's inputs or outputs (evaluators match by name)."""
    from targets.openvino import port_name

    for kind in ("inputs", "outputs"):
        old = [port_name(p, i, kind) for i, p in enumerate(getattr(before, kind))]
        new = [port_name(p, i, kind) for i, p in enumerate(getattr(after, kind))]
        if old != new:
            raise ValueError(f"the model's {kind} changed from {old} to {new}")


class QuantizeOptions(PassConfig):
    """Options nncf.quantize and nncf.quantize_with_accuracy_control share."""

    calibration: DatasetRef = Field(description="The dataset NNCF calibrates activation ranges on (one sample per inference).")
    preset: Literal["performance", "mixed"] = Field(
        default="mixed",
        description="performance: symmetric weights and activations; mixed: symmetric weights, asymmetric activations "
        "(better for transformers, whose activations are not centred on zero).",
    )
    model_type: Literal["transformer"] | None = Field(
        default=None, description="transformer: NNCF's patterns for transformer blocks (keeps sensitive ops such as Softmax in float)."
    )
    subset_size: int = Field(
        default=300, ge=1, description="Calibration samples used; capped at the dataset's size (with a note when it is)."
    )
    fast_bias_correction: bool = Field(
        default=True, description="NNCF's fast bias correction; false runs the slower, usually more accurate one."
    )
    smooth_quant_alpha: float | None = Field(
        default=None,
        ge=-1,
        le=1,
        description="SmoothQuant's migration strength for MatMuls (Xiao et al. 2023, section 4): how much of the activations' "
        "outlier range moves into the weights before quantization. NNCF applies it with model_type transformer; null keeps "
        "NNCF's default (0.95), -1 turns it off. Lower values keep more range in the activations: the best value is "
        "model-specific, so search it.",
    )
    ignored_scope: IgnoredScope = Field(default_factory=IgnoredScope, description="Nodes left in floating point (nncf.IgnoredScope).")
    target_device: Literal["ANY", "CPU", "GPU", "NPU", "CPU_SPR"] = Field(
        default="ANY", description="nncf.TargetDevice whose quantization rules apply (which ops, which schemes)."
    )
