"""Fake runtimes for the evaluator tests: a session whose prepared run counts itself (and can
fail), and a target that opens real ONNX Runtime CPU sessions while counting them."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from engine.core.artifact import ModelArtifact
from engine.core.errors import KilnError
from engine.core.target import Availability, Session, Target, TargetConfig, TensorSpec


class FakeSession(Session):
    """Doubles ``x``; a prepared run counts itself and says it is bound on the device."""

    def __init__(self, fail: bool) -> None:
        super().__init__(inputs=[TensorSpec("x", "float32", ("batch", 4))], outputs=[TensorSpec("y", "float32", ("batch", 4))])
        self.details = {"io_binding": "bound"}
        self.fail = fail
        self.prepared_runs = self.plain_runs = self.syncs = 0
        self.lock = threading.Lock()

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self.fail:
            raise KilnError("boom")
        with self.lock:
            self.plain_runs += 1
        return [feeds["x"] * 2]

    def prepare(self, feeds: dict[str, np.ndarray]) -> Callable[[], None]:
        def call() -> None:
            if self.fail:
                raise KilnError("boom")
            with self.lock:
                self.prepared_runs += 1

        return call

    def synchronize(self) -> None:
        with self.lock:
            self.syncs += 1


class FakeTarget(Target):
    runtime = "fake"
    summary = "test runtime"
    accepts = ("onnx",)

    def __init__(self, config: TargetConfig, fail: bool = False) -> None:
        super().__init__(config)
        self.fail = fail
        self.sessions: list[FakeSession] = []

    def availability(self) -> Availability:
        return Availability(True)

    def open_session(self, model: ModelArtifact) -> Session:
        session = FakeSession(self.fail)
        self.sessions.append(session)
        return session


class RecordingTarget(Target):
    """ONNX Runtime on the CPU, counting the sessions it opens."""

    runtime = "recording"
    summary = "test runtime"
    accepts = ("onnx",)
    opened = 0

    def availability(self) -> Availability:
        return Availability(True)

    def open_session(self, model: ModelArtifact) -> Session:
        from targets.onnxruntime import OnnxRuntimeTarget

        self.opened += 1
        inner = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id=self.id, runtime="onnxruntime", intra_op_threads=1))
        return inner.open_session(model)
