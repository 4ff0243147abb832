"""What ``quark_quantize`` needs around AMD Quark's ONNX quantizer (``quark.onnx``: a ``QConfig``
given to ``ModelQuantizer``, built on onnxruntime's quantization tools): its isolated
environment, its options, and Kiln's options turned into Quark's objects.

amd-quark 0.13 requires onnx >= 1.21, <= 1.22 (the main environment has 1.23), so the pass runs in
an environment of its own (engine.execute.environments) where onnx 1.22 shadows the main copy.
Quark imports torch but does not declare it: torch 2.13 (CPU) comes from the main environment,
as everything Quark does not pin does. Quark builds its onnxruntime custom-op library with torch's
C++ extension builder (ninja and a C++ compiler) the first time it is used; the build is kept in
the environment's folder (``torch_extensions/``), so each environment compiles it once.

Everything Quark-related is imported inside functions: the engine imports the pass modules in the
main environment, where amd-quark is not installed, to validate workflows.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.core import KilnError, PassConfig
from engine.core.config import EnvironmentSpec
from engine.core.refs import DatasetRef
from passes.common.library_logs import LibraryMessage, LogCollector

#: the pinned requirements of Quark's environment (amd-quark 0.13 needs onnx 1.21-1.22 and numpy 2)
QUARK_REQUIREMENTS = ("amd-quark==0.13", "numpy==2.4.6", "onnx==1.22.0", "onnxruntime==1.31.1")
QUARK_ENVIRONMENT = EnvironmentSpec(requirements=list(QUARK_REQUIREMENTS))
#: the distributions whose versions change what the pass writes (its job keys name them)
QUARK_LIBRARIES = ("amd-quark", "onnx", "onnxruntime", "numpy", "torch")

DataType = Literal["Int8", "UInt8", "Int16", "UInt16", "Int32", "UInt32", "Float16", "BFloat16", "BFP16"]
CalibMethod = Literal["MinMax", "Entropy", "Percentile", "Distribution", "MinMSE", "LayerwisePercentile"]

#: each algorithm Quark's QConfig takes (its algo_config), with the options Olive's Quark pass sets on it
ALGORITHM_OPTIONS: dict[str, tuple[str, ...]] = {
    "cle": (
        "cle_balance_method",
        "cle_steps",
        "cle_weight_threshold",
        "cle_scale_append_bias",
        "cle_scale_use_threshold",
        "cle_total_layer_diff_threshold",
    ),
    "smooth_quant": ("alpha",),
    "bias_correction": (),
    "gptq": (),
    "auto_mixprecision": (),
    "quarot": (),
    **dict.fromkeys(
        ("adaround", "adaquant"),
        (
            "optim_device",
            "infer_device",
            "fixed_seed",
            "data_size",
            "batch_size",
            "num_batches",
            "num_iterations",
            "learning_rate",
            "early_stop",
            "output_index",
            "lr_adjust",
            "target_op_type",
            "selective_update",
            "update_bias",
            "output_qdq",
            "drop_ratio",
            "mem_opt_level",
            "log_period",
            "dynamic_batch",
            "parallel",
            "reg_param",
            "beta_range",
            "warm_start",
        ),
    ),
}
#: Quark's config class of each algorithm (quark.onnx.quantization.config.algorithm)
ALGORITHM_CLASSES = {
    "cle": "CLEConfig",
    "smooth_quant": "SmoothQuantConfig",
    "bias_correction": "BiasCorrectionConfig",
    "gptq": "GPTQConfig",
    "auto_mixprecision": "AutoMixprecisionConfig",
    "quarot": "QuarotConfig",
    "adaround": "AdaRoundConfig",
    "adaquant": "AdaQuantConfig",
}
#: extra options whose values name quantization types (converted to Quark's enums in the environment)
TYPED_EXTRA = ("TensorQuantOverrides", "MixedPrecisionTensor")


class QuarkTensor(BaseModel):
    """How one kind of tensor is quantized (Quark's QTensorConfig)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data_type: DataType = Field(
        "Int8", description="Quark's data type (Int8, UInt8, Int16, ...; BFP16 and the float types need Quark's custom ops)."
    )
    symmetric: bool = Field(True, description="Symmetric ranges (zero point 0).")
    calibration_method: CalibMethod = Field("Percentile", description="How Quark measures the range.")
    quant_granularity: Literal["Tensor", "Channel", "Group"] = Field(
        "Tensor", description="One scale per tensor, per channel or per group."
    )
    scale_type: Literal["Float32", "PowerOf2", "Int16"] = Field(
        "Float32", description="How scales are stored (PowerOf2: Vitis AI's NPU scales)."
    )


def check_algorithms(value: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each algorithm names one Quark knows and only options Kiln sets on it."""
    for index, algorithm in enumerate(value):
        name = algorithm.get("name")
        if name not in ALGORITHM_OPTIONS:
            raise ValueError(f"algorithms[{index}].name is {name!r}; expected one of {', '.join(ALGORITHM_OPTIONS)}")
        unknown = sorted(set(algorithm) - {"name", *ALGORITHM_OPTIONS[name]})
        if unknown:
            allowed = ", ".join(ALGORITHM_OPTIONS[name]) or "none"
            raise ValueError(f"algorithms[{index}] ({name}) has no option {', '.join(unknown)}; its options: {allowed}")
    return value


class QuarkOptions(PassConfig):
    """AMD Quark's ONNX post-training quantization (QDQ, static, calibrated)."""

    calibration: DatasetRef = Field(..., description="Name of the workflow dataset Quark calibrates on.")
    calibration_samples: int | None = Field(None, ge=1, description="How many calibration samples to use (default: all of the dataset's).")
    activation: QuarkTensor = Field(
        default_factory=QuarkTensor, description="How activations are quantized (Quark's global_config.activation)."
    )
    weight: QuarkTensor = Field(default_factory=QuarkTensor, description="How weights are quantized (Quark's global_config.weight).")
    exclude: list[str] = Field(default_factory=list, description="Names of nodes Quark keeps in float.")
    algorithms: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Quark's algorithms, in order, each {name, options}: cle, smooth_quant, bias_correction, gptq, "
        "auto_mixprecision, quarot, adaround, adaquant (AdaRound/AdaQuant fine-tune with torch on the CPU).",
    )
    extra_options: dict[str, Any] = Field(
        default_factory=dict, description="Quark's extra options as Quark names them (EnableNPUCnn, OpTypesToQuantize, ...)."
    )

    @field_validator("algorithms")
    @classmethod
    def _check_algorithms(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return check_algorithms(value)


# ------------------------------------------------------------------------------------------------
# Below: run inside Quark's environment only.
def tensor_config(spec: QuarkTensor) -> Any:
    """Quark's QTensorConfig for ``spec``."""
    from quark.onnx.quantization.config import spec as quark_spec
    from quark.onnx.quantization.config.data_type import name_dt_map

    return quark_spec.QTensorConfig(
        symmetric=spec.symmetric,
        scale_type=quark_spec.ScaleType[spec.scale_type],
        calibration_method=quark_spec.CalibMethod[spec.calibration_method],
        quant_granularity=quark_spec.QuantGranularity[spec.quant_granularity],
        data_type=name_dt_map[spec.data_type],
    )


def algorithm_configs(algorithms: list[dict[str, Any]]) -> list[Any]:
    """Quark's AlgoConfig objects, each with the given options set (Olive's way: attribute by attribute)."""
    from quark.onnx.quantization.config import algorithm as quark_algorithm

    configs = []
    for entry in algorithms:
        config = getattr(quark_algorithm, ALGORITHM_CLASSES[entry["name"]])()
        for key, value in entry.items():
            if key != "name":
                setattr(config, key, tuple(value) if key in ("lr_adjust", "beta_range") else value)
        configs.append(config)
    return configs


def extra_options(given: dict[str, Any]) -> dict[str, Any]:
    """Quark's extra options: quantization type names in TensorQuantOverrides / MixedPrecisionTensor
    become Quark's enums; an option Quark does not know is an error (Quark would only warn)."""
    from quark.onnx import ExtendedQuantType, QuantType
    from quark.onnx.quantization.config.maps import QCONFIG_ALL_PARAMS

    unknown = sorted(set(given) - set(QCONFIG_ALL_PARAMS))
    if unknown:
        raise KilnError(f"config.extra_options: {', '.join(unknown)} is not an option of amd-quark's QConfig; remove it")
    types = {"Int8": QuantType.QInt8, "UInt8": QuantType.QUInt8, "Int16": QuantType.QInt16, "UInt16": QuantType.QUInt16}
    types.update({"Int32": ExtendedQuantType.QInt32, "UInt32": ExtendedQuantType.QUInt32, "Float16": ExtendedQuantType.QFloat16})
    types.update({"BFloat16": ExtendedQuantType.QBFloat16, "BFP16": ExtendedQuantType.QBFP, "BFP": ExtendedQuantType.QBFP})
    options = {k: v for k, v in given.items() if k not in TYPED_EXTRA}
    if "MixedPrecisionTensor" in given:
        options["MixedPrecisionTensor"] = {types[k]: v for k, v in given["MixedPrecisionTensor"].items()}
    if "TensorQuantOverrides" in given:
        overrides = {}
        for tensor, entries in given["TensorQuantOverrides"].items():
            overrides[tensor] = [{**e, "quant_type": types[e["quant_type"]]} if "quant_type" in e else dict(e) for e in entries]
        options["TensorQuantOverrides"] = overrides
    return options


def q_config(cfg: QuarkOptions) -> Any:
    """The QConfig ``ModelQuantizer`` runs with."""
    from quark.onnx.quantization.config.config import QConfig
    from quark.onnx.quantization.config.spec import QLayerConfig

    activation = tensor_config(cfg.activation)
    layer = QLayerConfig(input_tensors=activation, weight=tensor_config(cfg.weight))  # 0.13: activation is input_tensors
    return QConfig(
        global_config=layer,
        exclude=list(cfg.exclude),
        algo_config=algorithm_configs(cfg.algorithms),
        extra_options=extra_options(cfg.extra_options),
    )


class CalibrationReader:
    """onnxruntime's CalibrationDataReader protocol over Kiln's calibration batches (rewindable:
    Quark reads the data once per algorithm)."""

    def __init__(self, batches: list[dict[str, Any]]) -> None:
        self.batches = batches
        self.position = 0

    def get_next(self) -> dict[str, Any] | None:
        if self.position >= len(self.batches):
            return None
        self.position += 1
        return self.batches[self.position - 1]

    def rewind(self) -> None:
        self.position = 0

    def __len__(self) -> int:
        return len(self.batches)


def reader(batches: list[dict[str, Any]]) -> Any:
    """A CalibrationReader that is also an onnxruntime CalibrationDataReader (Quark checks the type)."""
    from onnxruntime.quantization import CalibrationDataReader

    cls = type("QuarkCalibrationReader", (CalibrationReader, CalibrationDataReader), {})
    return cls(batches)


def versions() -> dict[str, str]:
    """The versions Quark ran with, as this worker imported them."""
    from importlib import metadata

    return {name: metadata.version(name) for name in QUARK_LIBRARIES}


@contextmanager
def quark_session() -> Iterator[list[LibraryMessage]]:
    """Quark set up for one run: its custom-op build kept in the environment's folder, its
    warnings collected (its log lines still reach the job log). Quark's loggers (``<module>_screen``)
    do not propagate, so the collector is attached to each of them."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    try:
        import quark.onnx  # noqa: F401 - checks the environment before anything else
    except ImportError as error:
        raise KilnError(
            f"amd-quark's ONNX quantizer cannot be imported here ({error}); quark_quantize runs in its own environment "
            f"({', '.join(QUARK_REQUIREMENTS)}, torch from the main environment), which engine run builds: "
            "do not override the step's environment without it"
        ) from None
    collector = LogCollector(logging.WARNING, ("quark",))
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if name.startswith("quark")]
    for logger in loggers:
        logger.addHandler(collector)
    try:
        yield collector.messages
    finally:
        for logger in loggers:
            logger.removeHandler(collector)
