"""OpenVINO: run OpenVINO IR (``model.xml``) or ONNX files with the native OpenVINO runtime.

**Precision.** On a CPU with BF16 support OpenVINO runs FP32 models in bf16 unless told otherwise,
so the precision a model runs at is decided here, in this order:

1. the target's ``inference_precision_hint``, when set (the target config wins);
2. the model's own hint: ``openvino_convert`` (and the NNCF passes) write it into the IR's
   ``rt_info`` at ``runtime_options/INFERENCE_PRECISION_HINT``. OpenVINO 2026.4's
   ``compile_model`` does not apply that entry itself (it does for a few other runtime options),
   so this target reads it and passes it to ``compile_model``;
   A model that carries ``device`` asks for the device's default precision: no hint is passed;
3. the target's ``reference_precision_hint`` (default ``f32``) for models that carry no hint of
   their own (ONNX files, IR without one): the unoptimized FP32 reference really runs in FP32;
4. the device default (bf16 on this CPU), when all of the above are unset.

Each session's ``details`` records the hint asked for, where it came from and the precision the
compiled model reports actually in force.

openvino is imported inside the functions that use it, never at module import: the engine imports
this module to read ``Config`` when it validates a workflow, and ``engine --help`` must stay fast.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from engine.core.errors import KilnError, MissingDependency, TargetUnavailable
from engine.core.target import Availability, Target, TargetConfig, TensorSpec
from targets.openvino_compiled import compiled_cache
from targets.openvino_session import OpenVinoSession, compiled_property

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact

logger = logging.getLogger(__name__)

PrecisionHint = Literal["f32", "bf16", "f16"]
PRECISION_HINTS: tuple[str, ...] = ("f32", "bf16", "f16")
#: what a model carries to ask for the device's own default precision (no hint passed)
DEVICE_DEFAULT = "device"
#: where a model carries its precision hint in the IR's rt_info
HINT_RT_INFO: list[str] = ["runtime_options", "INFERENCE_PRECISION_HINT"]
DEVICES = ("CPU", "GPU", "NPU", "AUTO")

#: OpenVINO element type names → numpy dtype names (``Type.to_dtype`` maps bf16 to float16)
_OV_DTYPES: dict[str, str] = {
    "f64": "float64",
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",  # no numpy dtype; kept so a user sees what the model wants
    "i64": "int64",
    "i32": "int32",
    "i16": "int16",
    "i8": "int8",
    "u64": "uint64",
    "u32": "uint32",
    "u16": "uint16",
    "u8": "uint8",
    "boolean": "bool",
    "string": "object",
}


#: config fields added later, left out of ``to_json`` while None (their keys stay as before)
_OMITTED_AT_NONE = ("enable_hyper_threading", "enable_cpu_pinning", "scheduling_core_type")
#: what a session's details report in force, copied into inference_settings
_IN_FORCE = ("execution_devices", "inference_precision_hint", "performance_hint", "num_streams", "inference_num_threads")

_declined = False


def decline_telemetry() -> None:
    """Make every openvino_telemetry consent check of this process answer "declined".

    ``import openvino`` (its converter, ovc) and NNCF set up usage statistics for Google Analytics
    with ``enable_opt_in_dialog=False``, under which a user who never ran ``opt_in_out`` counts as
    consenting: importing openvino writes a client id under ``~/intel`` and converting a model
    sends events. Kiln never reaches the network from a plugin, so before openvino or nncf is
    imported the consent check is made to decline for this process (the answer ``opt_in_out
    --opt_out`` gives, without writing the user's consent file). Without openvino_telemetry both
    libraries use stubs that send nothing.
    """
    global _declined
    if _declined:
        return
    try:
        import openvino_telemetry
        from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker
    except ImportError:
        _declined = True
        return

    def declined(self: object, *args: object, **kwargs: object) -> Any:
        return ConsentCheckResult.DECLINED

    OptInChecker.check = declined  # type: ignore[method-assign]
    # an instance made before this call (the class is a singleton) keeps its consent: withdraw it
    instance = getattr(openvino_telemetry.Telemetry, "_SingletonMetaClass__single_instance", None)
    if instance is not None:
        instance.consent = False
    _declined = True


def import_openvino() -> Any:
    decline_telemetry()  # before openvino's first import, which sets telemetry up
    try:
        import openvino
    except ImportError as error:
        raise MissingDependency("openvino", "the openvino target", "pip install openvino") from error
    return openvino


def dtype_name(element_type: Any) -> str:
    """An OpenVINO element type as a numpy dtype name (``i64`` → ``int64``)."""
    name = element_type.get_type_name()
    return _OV_DTYPES.get(name, name)


def port_shape(port: Any) -> tuple[int | None, ...]:
    """Static dims as ints, dynamic ones (``?`` or an interval) as None; () for a dynamic rank."""
    shape = port.get_partial_shape()
    if shape.rank.is_dynamic:
        return ()
    return tuple(dim.get_length() if dim.is_static else None for dim in shape)


def port_name(port: Any, index: int, kind: str) -> str:
    try:
        return str(port.get_any_name())
    except RuntimeError:  # a port without tensor names
        return f"{kind}_{index}"


def model_precision_hint(model: Any) -> str | None:
    """The precision hint an ``ov.Model`` carries in its rt_info, or None."""
    if not model.has_rt_info(HINT_RT_INFO):
        return None
    value = str(model.get_rt_info(HINT_RT_INFO).astype(str))
    return value or None


def set_model_precision_hint(model: Any, hint: str | None) -> None:
    """Write ``hint`` into the model's rt_info (None removes it), so the IR file carries it."""
    if hint is not None:
        if hint not in (*PRECISION_HINTS, DEVICE_DEFAULT):
            raise ValueError(f"unknown precision hint {hint!r}; allowed: {', '.join(PRECISION_HINTS)}, {DEVICE_DEFAULT}")
        model.set_rt_info(hint, HINT_RT_INFO)
        return
    if model.has_rt_info(HINT_RT_INFO):
        options = model.get_rt_info()["runtime_options"]
        del options["INFERENCE_PRECISION_HINT"]
        if len(options) == 0:
            del model.get_rt_info()["runtime_options"]


class OpenVinoTarget(Target):
    runtime = "openvino"
    summary = "The native OpenVINO runtime on CPU, GPU, NPU or AUTO; runs OpenVINO IR and ONNX files, with pinned inference precision."
    version = "1"
    accepts = ("openvino", "onnx")
    libraries = ("openvino",)

    @classmethod
    def warm_modules(cls, input_format: str) -> tuple[str, ...]:
        return ("targets.openvino_offline", *cls.libraries)  # telemetry declined before openvino is imported

    class Config(TargetConfig):
        runtime: Literal["openvino"] = Field(description="Runs models with the OpenVINO runtime.")
        device: Literal["CPU", "GPU", "NPU", "AUTO"] = Field(
            default="CPU", description="OpenVINO device: CPU, GPU, NPU, or AUTO (OpenVINO picks). Case is ignored (`cpu` means CPU)."
        )
        performance_hint: Literal["LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT"] | None = Field(
            default="LATENCY",
            description="OpenVINO's PERFORMANCE_HINT (CUMULATIVE_THROUGHPUT: AUTO spreads requests over its devices); null leaves the device default.",
        )
        num_streams: int | None = Field(
            default=None, ge=1, le=1024, description="NUM_STREAMS: parallel inference streams. Omit to let the performance hint decide."
        )
        inference_num_threads: int | None = Field(
            default=None,
            ge=1,
            le=1024,
            description="INFERENCE_NUM_THREADS: threads for inference. Omit for the device default (all cores).",
        )
        inference_precision_hint: PrecisionHint | None = Field(
            default=None,
            description=(
                "INFERENCE_PRECISION_HINT for every model on this target, overriding the hint a model carries. "
                "Omit to use the model's own hint (see reference_precision_hint for models without one)."
            ),
        )
        reference_precision_hint: PrecisionHint | None = Field(
            default="f32",
            description=(
                "INFERENCE_PRECISION_HINT for models that carry no hint of their own (ONNX files, IR written without one), "
                "so the unoptimized reference runs in FP32. null runs them at the device default (bf16 on CPUs with BF16)."
            ),
        )

        enable_hyper_threading: bool | None = Field(
            default=None, description="ENABLE_HYPER_THREADING: use both logical processors of a core (CPU). Omit for the device default."
        )
        enable_cpu_pinning: bool | None = Field(
            default=None, description="ENABLE_CPU_PINNING: pin inference threads to cores (CPU). Omit for the device default."
        )
        scheduling_core_type: Literal["ANY_CORE", "PCORE_ONLY", "ECORE_ONLY"] | None = Field(
            default=None,
            description="SCHEDULING_CORE_TYPE: which cores of a hybrid CPU run inference. Omit for the device default.",
        )

        def to_json(self) -> dict[str, Any]:
            """As TargetConfig's; the fields added later appear only when set, so the keys of
            targets written before them stay the same."""
            data = super().to_json()
            for name in _OMITTED_AT_NONE:
                if data.get(name) is None:
                    data.pop(name, None)
            return data

        @field_validator("device", mode="before")
        @classmethod
        def _upper_case(cls, value: Any) -> Any:
            return value.upper() if isinstance(value, str) else value

    config: Config

    def __init__(self, config: TargetConfig) -> None:
        super().__init__(config)
        self._core: Any = None

    def core(self) -> Any:
        if self._core is None:
            self._core = import_openvino().Core()
        return self._core

    def availability(self) -> Availability:
        try:
            openvino = import_openvino()
        except MissingDependency as error:
            return Availability(False, str(error))
        present = list(self.core().available_devices)
        device = self.config.device
        found = bool(present) if device == "AUTO" else any(name == device or name.startswith(device + ".") for name in present)
        if not found:
            return Availability(
                False,
                f"OpenVINO {openvino.__version__} sees no {device} device here; devices present: {', '.join(present) or 'none'}",
            )
        return Availability(True)

    def precision_hint_for(self, model_hint: str | None) -> tuple[str | None, str]:
        """(hint to pass to compile_model, where it comes from) for a model carrying ``model_hint``."""
        if self.config.inference_precision_hint is not None:
            return self.config.inference_precision_hint, "target"
        if model_hint == DEVICE_DEFAULT:
            return None, "model: device default"
        if model_hint is not None:
            return model_hint, "model"
        if self.config.reference_precision_hint is not None:
            return self.config.reference_precision_hint, "reference_precision_hint"
        return None, "device_default"

    def compile_config(self, hint: str | None) -> dict[str, Any]:
        config: dict[str, Any] = {}
        if self.config.performance_hint is not None:
            config["PERFORMANCE_HINT"] = self.config.performance_hint
        if self.config.num_streams is not None:
            config["NUM_STREAMS"] = self.config.num_streams
        if self.config.inference_num_threads is not None:
            config["INFERENCE_NUM_THREADS"] = self.config.inference_num_threads
        if self.config.enable_hyper_threading is not None:
            config["ENABLE_HYPER_THREADING"] = self.config.enable_hyper_threading
        if self.config.enable_cpu_pinning is not None:
            config["ENABLE_CPU_PINNING"] = self.config.enable_cpu_pinning
        if self.config.scheduling_core_type is not None:
            config["SCHEDULING_CORE_TYPE"] = self.config.scheduling_core_type
        if hint is not None:
            config["INFERENCE_PRECISION_HINT"] = hint
        return config

    def inference_settings(self, session_details: dict[str, Any]) -> dict[str, Any]:
        """The device and the ``compile_model`` config as measured, and what the compiled model
        reports in force (precision, hint, streams, threads, devices)."""
        details = session_details
        return {
            "runtime": "openvino",
            "openvino_version": details.get("openvino_version"),
            "device": details.get("device", self.config.device),
            "compile_config": dict(details.get("compile_config") or {}),
            "in_force": {key: details.get(key) for key in _IN_FORCE},
            "io_binding": {"mode": details.get("io_binding", "off"), "note": details.get("io_binding_note")},
        }

    def snippet(self, settings: dict[str, Any], model_path: str) -> str:
        """A runnable program: ``ov.Core().compile_model(path, device, config)`` as measured,
        and an infer request."""
        config = dict(settings.get("compile_config") or {})
        lines = [
            "import openvino as ov",
            "",
            "core = ov.Core()",
            f"config = {config!r}",
            f"compiled = core.compile_model({model_path!r}, {str(settings.get('device') or 'CPU')!r}, config)",
            "request = compiled.create_infer_request()  # one per thread serving requests",
        ]
        if (settings.get("io_binding") or {}).get("mode") in ("device", "host"):
            lines += [
                "",
                "# as measured: input tensors set once, sharing the arrays' memory; infer() then only runs",
                "# for name, array in feeds.items():",
                "#     request.set_tensor(name, ov.Tensor(array, shared_memory=True))",
                "# request.infer(); outputs = [request.get_output_tensor(i).data for i in range(len(compiled.outputs))]",
            ]
        else:
            lines += ["", "# outputs = request.infer({input name: numpy array})"]
        return "\n".join(lines) + "\n"

    def _cpu_details(self, compiled: Any) -> dict[str, Any]:
        """The CPU scheduling options in force, where the target sets them."""
        names = {
            "enable_hyper_threading": "ENABLE_HYPER_THREADING",
            "enable_cpu_pinning": "ENABLE_CPU_PINNING",
            "scheduling_core_type": "SCHEDULING_CORE_TYPE",
        }
        return {field: compiled_property(compiled, key) for field, key in names.items() if getattr(self.config, field) is not None}

    def open_session(self, model: ModelArtifact) -> OpenVinoSession:
        if model.format not in self.accepts:
            raise KilnError(f"target '{self.id}' (openvino) runs OpenVINO IR and ONNX models, got a {model.format} model")
        availability = self.availability()
        if not availability.ok:
            raise TargetUnavailable(f"target '{self.id}': {availability.reason}")
        openvino = import_openvino()
        path = model.model_file
        if not path.is_file():
            raise KilnError(f"target '{self.id}': no model file at {path}")
        core = self.core()
        try:
            ov_model = core.read_model(str(path))
        except RuntimeError as error:
            raise KilnError(f"openvino could not read {path}: {error}") from error
        model_hint = model_precision_hint(ov_model)
        hint, source = self.precision_hint_for(model_hint)
        config = self.compile_config(hint)
        try:
            with compiled_cache(self.cache_dir, model) as cache_dir:  # the blob of an earlier compilation, checked
                compiled = core.compile_model(ov_model, self.config.device, {**config, "CACHE_DIR": cache_dir} if cache_dir else config)
        except RuntimeError as error:
            raise KilnError(f"openvino could not compile {path} for {self.config.device} with {config}: {error}") from error
        inputs = [
            TensorSpec(port_name(p, i, "input"), dtype_name(p.get_element_type()), port_shape(p)) for i, p in enumerate(compiled.inputs)
        ]
        outputs = [
            TensorSpec(port_name(p, i, "output"), dtype_name(p.get_element_type()), port_shape(p)) for i, p in enumerate(compiled.outputs)
        ]
        in_force = compiled_property(compiled, "INFERENCE_PRECISION_HINT")
        details: dict[str, Any] = {
            "runtime": "openvino",
            "openvino_version": openvino.__version__,
            "device": self.config.device,
            "execution_devices": compiled_property(compiled, "EXECUTION_DEVICES"),
            # the precision the compiled model reports in force (None where the device does not say: AUTO)
            "inference_precision_hint": in_force,
            "precision_hint": in_force if in_force is not None else hint,
            "precision_hint_requested": hint,
            "precision_hint_source": source,
            "model_precision_hint": model_hint,
            "performance_hint": compiled_property(compiled, "PERFORMANCE_HINT"),
            "num_streams": compiled_property(compiled, "NUM_STREAMS"),
            "inference_num_threads": compiled_property(compiled, "INFERENCE_NUM_THREADS"),
            "compile_config": {key: str(value) for key, value in config.items()},
            **self._cpu_details(compiled),
        }
        if in_force is not None and hint is not None and in_force != hint:
            logger.info("target %s: asked for precision %s, %s runs the model in %s", self.id, hint, self.config.device, in_force)
        return OpenVinoSession(compiled, inputs, outputs, details)
