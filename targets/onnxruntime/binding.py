"""ONNX Runtime I/O binding: inputs copied once to the session's device, outputs pre-allocated
and reused, runs through ``run_with_iobinding``.

A ``Binder`` keeps, per input-shape signature, one ``IOBinding`` with its input OrtValues and the
output OrtValues the first run allocated (re-bound so later runs write into them). Without a CUDA
graph it keeps the latest signature only (a new shape re-binds). With a CUDA graph ONNX Runtime
captures one graph per ``gpu_graph_id`` run option at fixed addresses, so every signature keeps
its own binding and graph id (1, 2, ...), up to ``MAX_CUDA_GRAPHS`` per session: CUDA graphs need
static shapes, and each shape seen is one more captured graph.

onnxruntime is imported only inside functions (see the package docstring).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.core.errors import KilnError

if TYPE_CHECKING:
    import numpy as np

#: how many CUDA graphs (input shapes) one session captures before it refuses another shape
MAX_CUDA_GRAPHS = 8
#: the run option that names the CUDA graph a run captures or replays
GRAPH_ID = "gpu_graph_id"
#: ``gpu_graph_id`` for a run that neither captures nor replays a graph
SKIP_CAPTURE = "-1"
STATIC_SHAPES = "static shapes: a CUDA graph is captured per input shape"

Signature = tuple[tuple[str, tuple[int, ...], str], ...]


def signature_of(feeds: dict[str, np.ndarray]) -> Signature:
    return tuple(sorted((name, tuple(int(d) for d in array.shape), str(array.dtype)) for name, array in feeds.items()))


def describe(signature: Signature) -> str:
    return ", ".join(f"{name}{list(shape)} {dtype}" for name, shape, dtype in signature)


@dataclass
class Plan:
    """Where a session binds: ``device`` is "cuda" or "cpu" (OrtValue device names)."""

    device: str
    device_id: int
    cuda_graph: bool
    output_names: list[str]
    #: numpy dtype names of the outputs, in the order of ``output_names``
    output_dtypes: list[str]
    #: graph ids handed out in this session (shared by every binder of the session)
    graph_ids: list[int] = field(default_factory=list)
    captured: list[Signature] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def mode(self) -> str:
        """``details["io_binding"]``: "device" when bound on a GPU, "host" when bound in CPU memory."""
        return "device" if self.device != "cpu" else "host"

    def next_graph_id(self, signature: Signature) -> int:
        with self.lock:
            if len(self.graph_ids) >= MAX_CUDA_GRAPHS:
                shapes = "; ".join(describe(known) for known in self.captured)
                raise KilnError(
                    f"this session already captured {MAX_CUDA_GRAPHS} CUDA graphs, one per input shape ({shapes}); "
                    f"{describe(signature)} would be one more: CUDA graphs need static shapes, so feed fewer distinct "
                    "shapes (pad to fixed ones) or turn the CUDA graph off"
                )
            graph_id = len(self.graph_ids) + 1
            self.graph_ids.append(graph_id)
            self.captured.append(signature)
            return graph_id


@dataclass
class Bound:
    """One input-shape signature bound: the IOBinding, its OrtValues and run options."""

    io_binding: Any
    inputs: dict[str, Any]
    outputs: list[Any]
    run_options: Any
    graph_id: int | None


class Binder:
    """Bindings for one caller (the session's own, or one per concurrent thread)."""

    def __init__(self, session: Any, plan: Plan, errors: tuple[type[BaseException], ...]) -> None:
        self._session = session
        self._plan = plan
        self._errors = errors
        self._bound: dict[Signature, Bound] = {}
        self.last: Bound | None = None

    def bind(self, feeds: dict[str, np.ndarray]) -> Bound:
        """The binding for ``feeds``' shapes with ``feeds`` copied in: an existing one updated in
        place (same device addresses, as a CUDA graph needs), or a new one after a first run that
        allocates its outputs."""
        signature = signature_of(feeds)
        bound = self._bound.get(signature)
        if bound is not None:
            for name, array in feeds.items():
                bound.inputs[name].update_inplace(_contiguous(array))
            self.last = bound
            return bound
        bound = self._new(feeds, signature)
        if not self._plan.cuda_graph:
            self._bound.clear()  # without a graph one binding is enough; a new shape re-binds
        self._bound[signature] = bound
        self.last = bound
        return bound

    def _new(self, feeds: dict[str, np.ndarray], signature: Signature) -> Bound:
        import numpy as np
        import onnxruntime

        plan = self._plan
        graph_id = plan.next_graph_id(signature) if plan.cuda_graph else None
        io_binding = self._session.io_binding()
        inputs: dict[str, Any] = {}
        try:
            for name, array in feeds.items():
                # in CPU memory an OrtValue shares the array's buffer, which update_inplace then
                # rewrites: bind a copy, never the caller's array
                host = np.array(array, copy=True, order="C") if plan.device == "cpu" else _contiguous(array)
                value = onnxruntime.OrtValue.ortvalue_from_numpy(host, plan.device, plan.device_id)
                io_binding.bind_ortvalue_input(name, value)
                inputs[name] = value
            for name in plan.output_names:
                io_binding.bind_output(name, plan.device, plan.device_id)
            first = onnxruntime.RunOptions()
            if graph_id is not None:
                first.add_run_config_entry(GRAPH_ID, SKIP_CAPTURE)
            # the first run (outside any graph) tells the outputs' shapes; outputs of those shapes
            # allocated here and bound keep later runs, and the graph captured by the next one,
            # writing there. (The OrtValues get_outputs returns are not kept: some onnxruntime
            # versions hand out views of the binding's own list, which re-binding invalidates.)
            self._session.run_with_iobinding(io_binding, first)
            shapes = [tuple(value.shape()) for value in io_binding.get_outputs()]
            outputs = []
            for name, dtype, shape in zip(plan.output_names, plan.output_dtypes, shapes, strict=True):
                value = onnxruntime.OrtValue.ortvalue_from_shape_and_type(shape, np.dtype(dtype), plan.device, plan.device_id)
                io_binding.bind_ortvalue_output(name, value)
                outputs.append(value)
            run_options = onnxruntime.RunOptions()
            if graph_id is not None:
                run_options.add_run_config_entry(GRAPH_ID, str(graph_id))
        except (*self._errors, TypeError) as error:
            raise KilnError(f"onnxruntime failed to run the model with I/O binding: {type(error).__name__}: {error}") from error
        return Bound(io_binding, inputs, outputs, run_options, graph_id)

    def execute(self, bound: Bound) -> None:
        try:
            self._session.run_with_iobinding(bound.io_binding, bound.run_options)
        except self._errors as error:
            raise KilnError(f"onnxruntime failed to run the model with I/O binding: {type(error).__name__}: {error}") from error

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Bind (or update) ``feeds``, run, and copy the outputs to the host."""
        import numpy as np

        bound = self.bind(feeds)
        self.execute(bound)
        if self._plan.device == "cpu":
            # the OrtValues are reused by the next run: hand out copies
            return [np.array(value.numpy(), copy=True) for value in bound.outputs]
        return [value.numpy() for value in bound.outputs]

    def synchronize(self) -> None:
        if self._plan.device != "cpu" and self.last is not None:
            self.last.io_binding.synchronize_outputs()


def _contiguous(array: np.ndarray) -> np.ndarray:
    import numpy as np

    return np.ascontiguousarray(array)
