"""Passes (and an evaluator) that misbehave on purpose, to test how the engine survives them.
Registered through KILN_PLUGINS by the ``test_plugins`` fixture; never shipped."""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
import time

from engine.core import (
    EvalContext,
    Evaluator,
    EvaluatorConfig,
    MetricResult,
    ModelArtifact,
    Pass,
    PassConfig,
    PassContext,
    PassResult,
    SettingInapplicable,
)


class _OnnxToOnnx(Pass):
    accepts = ("onnx",)
    produces = "onnx"


class Crash(_OnnxToOnnx):
    name = "crash"
    summary = "dies of a segmentation fault, as a native runtime can"

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        ctypes.string_at(0)  # reads address 0: SIGSEGV
        raise AssertionError("unreachable")


class Sleep(_OnnxToOnnx):
    name = "sleep"
    summary = "sleeps, then copies its input"

    class Config(PassConfig):
        seconds: float = 60.0

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        started = time.time()
        time.sleep(self.config.seconds)
        shutil.copy(model.model_file, ctx.output_dir / "model.onnx")
        return PassResult(model=ModelArtifact.from_folder("onnx", ctx.output_dir), details={"slept": [started, time.time()]})


class Hang(Sleep):
    name = "hang"
    summary = "sleeps past its own default timeout"
    default_timeout_s = 2.0


class Boom(_OnnxToOnnx):
    name = "boom"
    summary = "raises an error from a library"

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        raise ValueError("the library refused this model")


class Copy(_OnnxToOnnx):
    name = "copy"
    summary = "copies its input (tags it so the copy has its own digest)"

    class Config(PassConfig):
        tag: str = "a"

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        shutil.copy(model.model_file, ctx.output_dir / "model.onnx")
        (ctx.output_dir / "tag.txt").write_text(self.config.tag)
        return PassResult(model=ModelArtifact.from_folder("onnx", ctx.output_dir), details={"tag": self.config.tag})


class Where(Copy):
    name = "where"
    summary = "copies its input and says which Python environment it ran in"

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        result = super().run(model, ctx)
        import six  # type: ignore[import-untyped]  # only the step's environment has it

        return PassResult(model=result.model, details={"prefix": sys.prefix, "six": six.__version__})


class Pid(Copy):
    name = "pid"
    summary = "copies its input, prints its tag, and says which process ran it and what a job before it left set"

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        result = super().run(model, ctx)
        print(f"output of {self.config.tag}")
        leaked = os.environ.get("KILN_TEST_LEFT_BEHIND")
        os.environ["KILN_TEST_LEFT_BEHIND"] = self.config.tag  # a serving worker puts its environment back
        return PassResult(model=result.model, details={"pid": os.getpid(), "left_behind": leaked, "cwd": os.getcwd()})


#: what Hoard jobs keep alive in the worker's process
_HOARD: list[bytes] = []


class Hoard(Pid):
    name = "hoard"
    summary = "copies its input and keeps `megabytes` of memory alive in its process after it ends (a library's cache)"

    class Config(Pid.Config):
        megabytes: int = 0

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        _HOARD.append(b"\x01" * (self.config.megabytes << 20))  # written, so resident
        return super().run(model, ctx)


class Placed(Evaluator):
    """Stands for a GPU target's session refusing a setting the model cannot take (a CUDA graph
    with nodes on the CPU): with two intra-op threads it raises SettingInapplicable, as
    OnnxRuntimeTarget.open_session does; otherwise it reports the model's bytes."""

    name = "placed"
    summary = "refuses two intra-op threads as an inapplicable setting"
    metrics = ("bytes",)

    class Config(EvaluatorConfig):
        pass

    def evaluate(self, model: ModelArtifact, ctx: EvalContext) -> MetricResult:
        if getattr(ctx.target.config, "intra_op_threads", None) == 2:
            raise SettingInapplicable("target 'cpu': intra_op_threads=2 cannot apply to this model (3 nodes on CPUExecutionProvider)")
        return MetricResult(values={"bytes": float(model.model_file.stat().st_size)})
