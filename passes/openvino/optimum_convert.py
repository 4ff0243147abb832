"""Convert a Hugging Face model folder to OpenVINO IR with optimum-intel's exporter (Olive's
OpenVINOOptimumConversion): for a decoder, the stateful key/value-cache model OpenVINO GenAI and
ONNX Runtime's OpenVINO EP run, with optimum-intel's weight compression (int8, int4 with group
size, ratio, symmetric, AWQ, scale estimation...).

The export is optimum-intel's command line (``optimum-cli export openvino``), the interface its
options are documented for; Olive's ``ov_quant_config`` keys are its flags. optimum-intel 2.2
needs transformers < 5.6, older than Kiln's main environment holds, so the pass declares an
environment of its own (``OPTIMUM_ENVIRONMENT``: optimum-intel with transformers 5.5, torch 2.13.0,
openvino and nncf pinned), which ``engine run`` builds once; the command runs with that
environment's Python (``passes.openvino._optimum_cli`` explains its one adjustment). The
tokenizer is not converted (``--disable-convert-tokenizer``): the output is one IR.

The exported ``openvino_model.xml`` is read back and written as ``model.xml`` + ``model.bin``
through ``_ir.save_ir`` (canonical node names, no conversion parameters), so the same input and
options give the same bytes. A task that exports several models (an encoder-decoder, a diffusion
pipeline) is refused with the names of the models it made: Kiln's ``openvino`` format is one IR.

A ``dataset`` for data-aware compression (AWQ, scale estimation, GPTQ, mixed precision by
sensitivity) is optimum-intel's name for a public dataset (wikitext2, c4...), which it downloads:
it needs the network.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from engine.core import ModelArtifact, PassConfig, PassContext, PassResult, StrictConfig
from engine.core.config import EnvironmentSpec
from passes.openvino._base import OpenVinoPass

#: the pinned requirements of the export's environment (docs/passes.md, "openvino_optimum_convert")
OPTIMUM_REQUIREMENTS = (
    # optimum imports `datasets` where it can find it, and the main environment's (Kiln's hf_dataset
    # source: datasets 5, which needs huggingface-hub >= 1.31) fails beside this hub: a datasets of
    # this environment's own shadows it
    "datasets==4.8.5",
    "huggingface-hub==1.21.0",
    "nncf==3.4.0",
    "openvino==2026.4.1",
    "openvino-tokenizers==2026.4.1.0",
    "optimum==2.3.0",
    "optimum-intel==2.2.0",
    "torch==2.13.0",
    "transformers==5.5.4",
)
OPTIMUM_ENVIRONMENT = EnvironmentSpec(requirements=list(OPTIMUM_REQUIREMENTS))
EXPORTED = "openvino_model.xml"
DATA_AWARE = ("awq", "scale_estimation", "gptq", "lora_correction")


class WeightCompression(StrictConfig):
    """optimum-intel's weight formats and compression options (``optimum-cli export openvino``'s flags)."""

    weight_format: Literal["fp32", "fp16", "int8", "int4", "mxfp4", "nf4"] = Field(
        description="Weight precision: fp32 / fp16 store the weights so; int8, int4, mxfp4, nf4 compress them (nncf)."
    )
    group_size: int | None = Field(
        default=None, ge=-1, description="Weights per quantization group (int4: 128 by default); -1 per channel."
    )
    ratio: float | None = Field(
        default=None, gt=0, le=1, description="Share of the layers in 4 bits, the rest in backup_precision (1: all of them)."
    )
    sym: bool = Field(default=False, description="Symmetric quantization (no zero point).")
    all_layers: bool = Field(default=False, description="Compress the embeddings and the last MatMul to 4 bits too.")
    awq: bool = Field(default=False, description="AWQ (activation-aware scales); needs dataset.")
    scale_estimation: bool = Field(default=False, description="Scale estimation to reduce the compression error; needs dataset.")
    gptq: bool = Field(default=False, description="GPTQ weight updates; needs dataset.")
    lora_correction: bool = Field(default=False, description="LoRA correction of the compression error; needs dataset.")
    sensitivity_metric: (
        Literal[
            "weight_quantization_error",
            "hessian_input_activation",
            "mean_activation_variance",
            "max_activation_variance",
            "mean_activation_magnitude",
        ]
        | None
    ) = Field(default=None, description="How layers are ranked for the 4-bit share (ratio < 1).")
    backup_precision: Literal["none", "int8_sym", "int8_asym"] | None = Field(
        default=None, description="Precision of the layers left out of the 4-bit share."
    )
    group_size_fallback: Literal["error", "ignore", "adjust"] | None = Field(
        default=None, description="What to do with a layer whose size group_size does not divide."
    )
    dataset: str | None = Field(
        default=None,
        min_length=1,
        description="optimum-intel's calibration dataset name (wikitext2, c4...): downloaded, needs the network.",
    )
    num_samples: int | None = Field(default=None, ge=1, description="Calibration samples taken from dataset.")

    @model_validator(mode="after")
    def _consistent(self) -> WeightCompression:
        given = sorted(k for k in self.model_fields_set if k != "weight_format")
        if self.weight_format in ("fp32", "fp16") and given:
            raise ValueError(f"weight_format {self.weight_format} compresses nothing: drop {given}, or choose int8 / int4")
        needing = [k for k in DATA_AWARE if getattr(self, k)]
        if needing and self.dataset is None:
            raise ValueError(f"{needing} calibrate on data: give dataset (optimum-intel's dataset name, e.g. wikitext2)")
        return self

    def flags(self) -> list[str]:
        """The command line's flags for these options."""
        out = ["--weight-format", self.weight_format]
        for key in ("group_size", "ratio", "sensitivity_metric", "backup_precision", "group_size_fallback", "dataset", "num_samples"):
            value = getattr(self, key)
            if value is not None:
                out += [f"--{key.replace('_', '-')}", str(value)]
        out += [f"--{key.replace('_', '-')}" for key in ("sym", "all_layers", *DATA_AWARE) if getattr(self, key)]
        return out


class OpenVinoOptimumConvert(OpenVinoPass):
    name = "openvino_optimum_convert"
    summary = "Convert a Hugging Face model (a decoder with its key/value cache) to OpenVINO IR with optimum-intel, optionally compressing weights."
    version = "1"
    accepts = ("hf",)
    produces = "openvino"
    libraries = ("optimum-intel", "optimum", "transformers", "torch", "openvino", "nncf")
    environment = OPTIMUM_ENVIRONMENT
    default_timeout_s = 3600.0

    class Config(PassConfig):
        task: str = Field(
            default="auto",
            min_length=1,
            description="optimum's task, e.g. text-generation-with-past (a decoder with its key/value cache), feature-extraction; "
            "auto infers it from the model (with-past for decoders).",
        )
        library: Literal["transformers", "diffusers", "timm", "sentence_transformers", "open_clip"] | None = Field(
            default=None, description="The model's library; null lets optimum infer it."
        )
        stateful: bool = Field(default=True, description="A decoder keeps its key/value cache inside the model (OpenVINO's stateful form).")
        weight_compression: WeightCompression | None = Field(
            default=None, description="optimum-intel's weight format and compression options; null: optimum's default for the model."
        )

    config: Config

    @classmethod
    def warm_modules(cls, input_format: str) -> tuple[str, ...]:
        return ("targets.openvino_offline", "openvino")

    def command(self, source: Path, export_dir: Path, trust_remote_code: bool) -> list[str]:
        cfg = self.config
        argv = [sys.executable, "-m", "passes.openvino._optimum_cli", "export", "openvino", "--model", str(source), "--task", cfg.task]
        argv += ["--library", cfg.library] if cfg.library else []
        argv += ["--disable-convert-tokenizer"] + ([] if cfg.stateful else ["--disable-stateful"])
        argv += ["--trust-remote-code"] if trust_remote_code else []
        argv += cfg.weight_compression.flags() if cfg.weight_compression else []
        return [*argv, str(export_dir)]

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        from passes.openvino._quiet import decline_telemetry

        decline_telemetry()
        from passes.openvino import _ir

        source = Path(model.path)
        if not (source / "config.json").is_file():
            raise ValueError(f"{source} is not a Hugging Face folder: it has no config.json")
        export_dir = Path(ctx.workdir) / "optimum"
        argv = self.command(source, export_dir, model.attrs.get("trust_remote_code") is True)
        log = _export(argv, Path(ctx.workdir))
        made = sorted(p.name for p in export_dir.glob("*.xml")) if export_dir.is_dir() else []
        if made != [EXPORTED]:
            raise ValueError(
                f"optimum-intel exported {made or 'no model'} for task {self.config.task}; Kiln's openvino format is one IR ({EXPORTED})"
            )
        ov_model = _ir.read_ir(export_dir / EXPORTED)
        xml = _ir.save_ir(ov_model, Path(ctx.output_dir), None)
        written = _ir.read_ir(xml)
        inputs, outputs = _ir.describe_io(written.inputs, "input"), _ir.describe_io(written.outputs, "output")
        details: dict[str, Any] = {
            "command": ["optimum-cli", *argv[3:-1]],
            "inputs": inputs,
            "outputs": outputs,
            "stateful": bool(written.get_sinks()),
            "node_count": len(written.get_ops()),
            "weight_bytes": _ir.weight_bytes(written),
            "quantized_ops": _ir.quantized_ops(written),
            "library_warnings": [line for line in log.splitlines() if "warning" in line.lower()][-20:],
        }
        attrs = {**model.attrs, "inputs": [p["name"] for p in inputs], "outputs": [p["name"] for p in outputs]}
        return PassResult(model=ModelArtifact.from_folder("openvino", Path(ctx.output_dir), attrs=attrs), details=details)


def _export(argv: list[str], workdir: Path) -> str:
    """Run the export; its output (the job's log) is returned, the last lines raised on failure."""
    try:
        import optimum.intel  # noqa: F401 - checks the environment before anything else
    except ImportError as error:
        raise ValueError(
            f"optimum-intel cannot be imported here ({error}); openvino_optimum_convert runs in its own environment "
            f"({', '.join(OPTIMUM_REQUIREMENTS)}), which engine run builds: do not override the step's environment without it"
        ) from None
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    output = (done.stdout or "") + (done.stderr or "")
    print(output, file=sys.stderr)  # the job's log
    if done.returncode != 0:
        tail = " | ".join(line.strip() for line in output.strip().splitlines()[-6:])
        raise ValueError(f"optimum-cli export openvino failed (exit {done.returncode}): {tail}")
    return output
