"""The ONNX Runtime session behind the SDK's ``Session``: plain runs, or runs through I/O binding
(inputs and outputs kept on the session's device; see ``binding``), and the element types.

onnxruntime is imported inside functions, never at module import.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.core.errors import KilnError, MissingDependency
from engine.core.target import Session, TensorSpec
from targets.onnxruntime import binding

if TYPE_CHECKING:
    import numpy as np

#: ONNX Runtime's element type names (``tensor(float)``) → numpy dtype names
_ORT_DTYPES: dict[str, str] = {
    "float": "float32",
    "float16": "float16",
    "double": "float64",
    "bfloat16": "bfloat16",  # no numpy dtype; kept so a user sees what the model wants
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "bool": "bool",
    "string": "object",
}


def numpy_dtype_name(ort_type: str) -> str:
    """``tensor(int64)`` → ``int64``, ``tensor(float)`` → ``float32``; a non-tensor type
    (``seq(tensor(float))``, ``map(...)``) is returned unchanged."""
    if ort_type.startswith("tensor(") and ort_type.endswith(")"):
        element = ort_type[len("tensor(") : -1]
        return _ORT_DTYPES.get(element, element)
    return ort_type


def tensor_shape(dims: Any) -> tuple[int | str | None, ...]:
    if dims is None:  # a tensor of unknown rank
        return ()
    shape: list[int | str | None] = []
    for dim in dims:
        if isinstance(dim, int) and dim >= 0:
            shape.append(dim)
        elif isinstance(dim, str) and dim:
            shape.append(dim)
        else:
            shape.append(None)
    return tuple(shape)


def import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError as error:
        raise MissingDependency("onnxruntime", "the onnxruntime target", "pip install onnxruntime (or onnxruntime-gpu for CUDA)") from error
    return onnxruntime


def runtime_message(error: BaseException) -> str:
    """onnxruntime's message for a person: its C++ source location and the signature of the
    function that raised (``/onnxruntime_src/...cc:256 onnxruntime::Model::Model(...)``) taken
    out, the status code and the reason kept."""
    text = str(error)
    signature = r"(?:[\w:<>,*&]+ )*?[\w:~<>]+\((?:[^()]|\([^()]*\))*\)(?: const)? "
    text = re.sub(rf"/onnxruntime_src/\S+:\d+ (?:{signature})?", " ", text)
    return re.sub(r"\s+", " ", text).strip()


def runtime_errors() -> tuple[type[BaseException], ...]:
    """What onnxruntime raises on a model it cannot load or run: its pybind exceptions derive
    directly from ``Exception``, and its Python layer adds ValueError / RuntimeError."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = (
        "Fail",
        "InvalidArgument",
        "NoSuchFile",
        "NoModel",
        "EngineError",
        "RuntimeException",
        "InvalidProtobuf",
        "NotImplemented",
        "InvalidGraph",
        "EPFail",
    )
    found = tuple(getattr(state, name) for name in names if isinstance(getattr(state, name, None), type))
    return (*found, ValueError, RuntimeError)


class OnnxRuntimeSession(Session):
    """An ``onnxruntime.InferenceSession`` behind the SDK's ``Session``; with a binding ``plan``
    (the target's ``io_binding``) runs go through ONNX Runtime I/O binding (see ``binding``)."""

    def __init__(
        self,
        session: Any,
        inputs: list[TensorSpec],
        outputs: list[TensorSpec],
        details: dict[str, Any],
        plan: binding.Plan | None = None,
    ) -> None:
        super().__init__(inputs=inputs, outputs=outputs, details=details)
        self._session = session
        self._plan = plan
        self._binder = binding.Binder(session, plan, runtime_errors()) if plan is not None else None
        self.details.setdefault("io_binding", plan.mode if plan is not None else "off")

    def _live(self) -> Any:
        if self._session is None:
            raise KilnError("this onnxruntime session is closed")
        return self._session

    def _record_graphs(self) -> None:
        if self._plan is not None and self._plan.cuda_graph:
            graph = self.details.setdefault("cuda_graph", {"note": binding.STATIC_SHAPES, "captured_shapes": []})
            graph["captured_shapes"] = [{name: list(shape) for name, shape, _ in signature} for signature in self._plan.captured]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        session = self._live()
        if self._binder is not None:
            try:
                return self._binder.run(feeds)
            finally:
                self._record_graphs()
        try:
            return list(session.run(None, feeds))
        except runtime_errors() as error:
            raise KilnError(f"onnxruntime failed to run the model: {type(error).__name__}: {runtime_message(error)}") from error

    def prepare(self, feeds: dict[str, np.ndarray]) -> Callable[[], None]:
        """With I/O binding: ``feeds`` copied to the device once, outputs allocated by a first
        run; the call returned only runs (results stay in the bound outputs). Without it, the
        SDK's default (a host-to-host ``run``)."""
        self._live()
        if self._binder is None:
            return super().prepare(feeds)
        binder = self._binder
        try:
            bound = binder.bind(feeds)
        finally:
            self._record_graphs()

        def run() -> None:
            binder.last = bound
            binder.execute(bound)

        return run

    def concurrent(self) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
        """ONNX Runtime's ``run`` is safe to call from several threads; bound runs are not (their
        OrtValues are rewritten), so each caller gets bindings of its own."""
        session = self._live()
        if self._plan is None:
            return self.run
        return binding.Binder(session, self._plan, runtime_errors()).run

    def synchronize(self) -> None:
        if self._binder is not None:
            self._binder.synchronize()

    def close(self) -> None:
        # InferenceSession has no close(); dropping the last reference frees its memory.
        self._session = None
        self._binder = None
