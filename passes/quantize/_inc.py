"""What ``inc_quantize`` and ``inc_quantize_accuracy`` share: Intel Neural Compressor's ONNX path
(its 2.x API: ``PostTrainingQuantConfig`` and ``quantization.fit``), in the isolated environment it
needs, with Kiln's options turned into INC's.

INC's ONNX support last shipped in neural-compressor 3.7.1, which needs numpy < 2, onnx <= 1.18
(1.19 removed ``onnx.mapping``), ``six`` and ``setuptools < 81`` (``pkg_resources``) without
declaring the last two. None of that can share Kiln's main environment, so both passes declare
``INC_ENVIRONMENT``: ``engine run`` builds it once (engine.execute.environments) and their jobs run with
its Python. The environment's packages come first there, the main environment's after: numpy 1.26
and onnx 1.18 shadow the main ones, so onnxruntime is pinned in it too (1.31.1, the main
environment's release, runs with numpy 1.x).

INC writes its working files (tuning history, deploy.yaml) under ``nc_workspace/`` in the job's
work folder, and logs through its own ``neural_compressor`` logger to the worker's stderr, which is
the job's log (``<store>/logs/<key>.log``); its warnings are also kept for the details.

Everything INC-related is imported inside functions: the engine imports the pass modules in the
main environment, where neural-compressor is not installed, to validate workflows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from engine.core import KilnError, PassConfig, PassContext
from engine.core.config import EnvironmentSpec
from engine.core.refs import DatasetRef
from passes.common.library_logs import LibraryMessage, LogCollector
from passes.common.onnx_io import OnnxPass
from passes.quantize import isolated_output
from passes.quantize.ort_quantize_config import with_static_defaults

if TYPE_CHECKING:
    import onnx

    from passes.quantize.calibration import CalibrationFeed

#: the pinned requirements of INC's environment (docs/targets.md, "Intel Neural Compressor")
INC_REQUIREMENTS = (
    "neural-compressor==3.7.1",
    "numpy==1.26.4",
    "onnx==1.18.0",
    "onnxruntime==1.31.1",
    "setuptools==80.9.0",
    "six==1.17.0",
)
INC_ENVIRONMENT = EnvironmentSpec(requirements=list(INC_REQUIREMENTS))
#: the distributions whose versions change what the passes write (their job keys name them)
INC_LIBRARIES = ("neural-compressor", "onnx", "onnxruntime", "numpy")

#: options only static mode reads; given with mode dynamic they are an error
STATIC_ONLY = ("calibration", "calibration_method", "calibration_samples", "smooth_quant", "smooth_quant_alpha")
#: what static mode uses for these when they are not given (filled in, so the job key names them)
STATIC_DEFAULTS: dict[str, Any] = {"calibration_method": "minmax", "calibration_samples": 100, "smooth_quant": False}


class IncPass(OnnxPass):
    """What both INC passes declare: ONNX in and out, INC's libraries and its environment."""

    accepts = ("onnx",)
    produces = "onnx"
    libraries = INC_LIBRARIES
    environment = INC_ENVIRONMENT
    default_timeout_s = 3600.0


class IncOptions(PassConfig):
    """INC's post-training quantization options for ONNX models."""

    mode: Literal["dynamic", "static"] = Field(
        "dynamic",
        description="dynamic: activations quantized at run time (no data); static: with ranges calibrated on `calibration`.",
    )
    quant_format: Literal["QOperator", "QDQ"] = Field(
        "QOperator",
        description="QOperator: integer ops (QLinearConv, QLinearMatMul...); QDQ: QuantizeLinear/DequantizeLinear around float ops (static only).",
    )
    calibration: DatasetRef | None = Field(None, description="static: name of the workflow dataset INC calibrates on.")
    calibration_samples: int | None = Field(
        None,
        ge=1,
        description="static: how many calibration samples INC reads (calibration_sampling_size; default 100, at most the dataset's).",
    )
    calibration_method: Literal["minmax", "kl", "percentile"] | None = Field(
        None, description="static: INC's activation calibration algorithm for the ops that offer it (Conv, MatMul); default minmax."
    )
    per_channel: bool = Field(
        False, description="Weights quantized per output channel where INC's ONNX adaptor allows it (Conv), else per tensor."
    )
    op_types_to_exclude: list[str] = Field(default_factory=list, description="Op types INC keeps in float (e.g. [Add]).")
    nodes_to_exclude: list[str] = Field(default_factory=list, description="Names of nodes INC keeps in float.")
    domain: Literal["auto", "cv", "nlp", "object_detection", "recommendation_system"] = Field(
        "auto", description="INC's model domain, which sets its default recipes (auto: INC guesses from the op types)."
    )
    graph_optimization_level: Literal["DISABLE_ALL", "ENABLE_BASIC", "ENABLE_EXTENDED", "ENABLE_ALL"] | None = Field(
        None,
        description="onnxruntime graph optimization INC applies before quantizing (null: INC's choice for the domain, BASIC for CV models).",
    )
    smooth_quant: bool | None = Field(
        None, description="static: INC's SmoothQuant recipe (moves activation outliers into the weights first)."
    )
    smooth_quant_alpha: float | None = Field(
        None, gt=0, le=1, description="static with smooth_quant: SmoothQuant's alpha (INC's default 0.5)."
    )
    reduce_range: bool | None = Field(None, description="7-bit weights (null: INC's default for the CPU).")

    @model_validator(mode="before")
    @classmethod
    def _fill_static_defaults(cls, data: Any) -> Any:
        return with_static_defaults(data, STATIC_DEFAULTS, cls.model_fields["mode"].default)

    @model_validator(mode="after")
    def _check_mode(self) -> IncOptions:
        if self.mode == "dynamic":
            given = [name for name in STATIC_ONLY if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} apply to mode static only (mode is dynamic)")
            if self.quant_format == "QDQ":
                raise ValueError("INC's dynamic quantization writes QOperator models only: use quant_format QOperator, or mode static")
        elif self.calibration is None:
            raise ValueError("mode static needs calibration: the name of a workflow dataset")
        if self.smooth_quant_alpha is not None and not self.smooth_quant:
            raise ValueError("smooth_quant_alpha needs smooth_quant: true")
        return self


# ------------------------------------------------------------------------------------------------
def conf_arguments(cfg: IncOptions, samples: int | None) -> dict[str, Any]:
    """``PostTrainingQuantConfig`` arguments for ``cfg`` (tuning and accuracy criteria left out)."""
    op_types: dict[str, Any] = {}
    weight: dict[str, Any] = {"granularity": ["per_channel" if cfg.per_channel else "per_tensor"]}
    if cfg.mode == "static":
        op_types[".*"] = {"weight": weight, "activation": {"algorithm": [cfg.calibration_method]}}
    else:
        op_types[".*"] = {"weight": weight}
    for op_type in cfg.op_types_to_exclude:
        op_types[op_type] = {"weight": {"dtype": ["fp32"]}, "activation": {"dtype": ["fp32"]}}
    names = {name: {"weight": {"dtype": ["fp32"]}, "activation": {"dtype": ["fp32"]}} for name in cfg.nodes_to_exclude}
    recipes: dict[str, Any] = {}
    if cfg.graph_optimization_level is not None:
        recipes["graph_optimization_level"] = cfg.graph_optimization_level
    if cfg.smooth_quant:
        recipes["smooth_quant"] = True
        if cfg.smooth_quant_alpha is not None:
            recipes["smooth_quant_args"] = {"alpha": cfg.smooth_quant_alpha}
    arguments: dict[str, Any] = {
        "approach": cfg.mode,
        "quant_format": cfg.quant_format,
        "domain": cfg.domain,
        "recipes": recipes,
        "op_type_dict": op_types,
        "op_name_dict": names or None,
        "reduce_range": cfg.reduce_range,
    }
    if samples is not None:
        arguments["calibration_sampling_size"] = [samples]
    return arguments


class CalibrationLoader:
    """INC's calibration dataloader: ``batch_size`` and (inputs, label) pairs, one sample each."""

    def __init__(self, feed: CalibrationFeed) -> None:
        self.feed = feed
        self.batch_size = 1

    def __iter__(self) -> Iterator[tuple[dict[str, Any], None]]:
        for batch in self.feed.batches:
            yield batch, None

    def __len__(self) -> int:
        return len(self.feed.batches)


def calibration_feed(cfg: IncOptions, ctx: PassContext, graph: onnx.ModelProto, notes: list[str]) -> CalibrationFeed | None:
    """The calibration samples of a static config (None for dynamic), at most calibration_samples."""
    if cfg.mode != "static" or cfg.calibration is None:
        return None
    return isolated_output.calibration_feed(cfg.calibration, cfg.calibration_samples, ctx, graph, notes)


def readable_input(source: Path, workdir: Path) -> Path:
    """``source``, or a copy with the IR version lowered to what this environment's onnx checks
    (onnx 1.18 refuses a model of a newer IR version than its own)."""
    import onnx

    header = onnx.load(str(source), load_external_data=False)
    if header.ir_version <= onnx.IR_VERSION:
        return source
    model = onnx.load(str(source))
    model.ir_version = onnx.IR_VERSION
    folder = workdir / "inc_input"
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(folder / "model.onnx"))
    return folder / "model.onnx"


def versions() -> dict[str, str]:
    """The versions INC ran with, as this worker imported them."""
    import neural_compressor
    import numpy
    import onnx
    import onnxruntime

    return {
        "neural-compressor": neural_compressor.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "numpy": numpy.__version__,
    }


@contextmanager
def inc_session(workdir: Path, seed: int = 1978) -> Iterator[list[LibraryMessage]]:
    """INC set up for one run: its workspace in ``workdir/nc_workspace``, its random seed, and its
    warnings collected (its log lines still reach the job log through its own handler)."""
    try:
        import neural_compressor  # noqa: F401 - checks the environment before anything else
    except ImportError as error:
        raise KilnError(
            f"neural-compressor cannot be imported here ({error}); the INC passes run in their own environment "
            f"({', '.join(INC_REQUIREMENTS)}), which engine run builds: do not override the step's environment without it"
        ) from None
    from neural_compressor.config import options

    workspace = workdir / "nc_workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    previous = (options.workspace, options.random_seed)
    options.workspace = str(workspace) + "/"
    options.random_seed = seed
    collector = LogCollector(logging.WARNING, ("neural_compressor",))
    logger = logging.getLogger("neural_compressor")
    logger.addHandler(collector)
    try:
        yield collector.messages
    finally:
        logger.removeHandler(collector)
        options.workspace, options.random_seed = previous


def quantized_model(result: Any, what: str) -> onnx.ModelProto:
    """The ModelProto of what ``quantization.fit`` returned; a KilnError when it returned nothing."""
    if result is None:
        raise KilnError(f"Intel Neural Compressor returned no model ({what}); its log is in the job's log")
    return result.model
