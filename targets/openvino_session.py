"""The OpenVINO session behind the SDK's ``Session``: a compiled model and its infer requests (one
per caller: a request is not safe to share across threads), and prepared runs whose input
tensors are set once. openvino is imported inside functions, never at module import."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.core.errors import KilnError
from engine.core.target import Session, TensorSpec

if TYPE_CHECKING:
    import numpy as np


def compiled_property(compiled: Any, name: str) -> Any:
    """A compiled model's property as a plain value, or None when the device does not report it
    (AUTO reports neither precision, streams nor threads)."""
    try:
        value = compiled.get_property(name)
    except RuntimeError:
        return None
    if hasattr(value, "get_type_name"):  # an element type: f32, bf16, ...
        return str(value.get_type_name())
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [str(item) for item in value]
    return str(getattr(value, "name", value))  # an enum such as PerformanceMode.LATENCY


def _infer(request: Any, outputs: list[Any], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    try:
        # share_inputs: no copy of the feeds; outputs are copied (the request reuses its buffers)
        results = request.infer(feeds, share_inputs=True, share_outputs=False)
        return [results[port] for port in outputs]
    except (RuntimeError, TypeError, ValueError, KeyError) as error:
        raise KilnError(f"openvino failed to run the model: {type(error).__name__}: {error}") from error


class _PreparedRun:
    """``request.infer()`` with its input tensors already set; holds the arrays they share."""

    def __init__(self, request: Any, arrays: list[np.ndarray]) -> None:
        self.request = request
        self._arrays = arrays

    def __call__(self) -> None:
        try:
            self.request.infer()
        except RuntimeError as error:
            raise KilnError(f"openvino failed to run the model: {error}") from error


class OpenVinoSession(Session):
    """An ``openvino.CompiledModel`` and one infer request behind the SDK's ``Session``."""

    def __init__(self, compiled: Any, inputs: list[TensorSpec], outputs: list[TensorSpec], details: dict[str, Any]) -> None:
        super().__init__(inputs=inputs, outputs=outputs, details=details)
        self._compiled = compiled
        self._request = compiled.create_infer_request()
        self.details.setdefault("io_binding", "off")

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self._request is None:
            raise KilnError("this openvino session is closed")
        return _infer(self._request, self._compiled.outputs, feeds)

    def prepare(self, feeds: dict[str, np.ndarray]) -> Callable[[], None]:
        """A request of its own with ``feeds`` set once as its input tensors (sharing the arrays'
        memory); the call returned only runs ``infer()``, results staying in the request's output
        tensors. On a CPU device its memory is the device's, so the run is bound there
        (``io_binding: device``); on a GPU or NPU the plugin still copies the inputs in per run
        (``host``)."""
        import numpy as np

        if self._compiled is None:
            raise KilnError("this openvino session is closed")
        from targets.openvino import import_openvino  # the module that imports this one

        openvino = import_openvino()
        request = self._compiled.create_infer_request()
        ports = {spec.name: port for spec, port in zip(self.inputs, self._compiled.inputs, strict=True)}
        kept: list[np.ndarray] = []
        try:
            for name, array in feeds.items():
                if name not in ports:
                    raise KeyError(f"the model has no input {name!r} (inputs: {', '.join(ports)})")
                data = np.ascontiguousarray(array)
                kept.append(data)  # the tensor shares this memory: keep it alive with the call
                request.set_tensor(ports[name], openvino.Tensor(data, shared_memory=True))
        except (RuntimeError, TypeError, ValueError, KeyError) as error:
            raise KilnError(f"openvino could not set the inputs: {type(error).__name__}: {error}") from error
        devices = self.details.get("execution_devices") or [self.details.get("device")]
        on_cpu = all(str(device).upper().startswith("CPU") for device in devices if device)
        self.details["io_binding"] = "device" if on_cpu else "host"
        self.details["io_binding_note"] = (
            "input tensors set once on an infer request; the CPU's memory is the device's"
            if on_cpu
            else "input tensors set once on an infer request; the device plugin copies them in per run"
        )

        return _PreparedRun(request, kept)

    def concurrent(self) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
        """A run function bound to a new infer request of the same compiled model (requests are
        not safe to share between threads; the compiled model is)."""
        if self._compiled is None:
            raise KilnError("this openvino session is closed")
        request = self._compiled.create_infer_request()
        outputs = self._compiled.outputs

        def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            return _infer(request, outputs, feeds)

        return run

    def close(self) -> None:
        self._request = None
        self._compiled = None
