"""Load: the model opened in a session on the target, and nothing run.

A model the target's runtime cannot load (an op it does not implement at the model's opset, an
OpenVINO IR that does not compile for the device, a GenAI folder the generator refuses) fails
here. The engine adds this evaluation by itself to a workflow whose evaluations open no session
(size alone), so that no candidate is chosen that its target could not open; a workflow may also
name it, for the time a session takes to open.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from engine.core.evaluator import EvalContext, Evaluator, EvaluatorConfig, MetricResult
from evaluators._sessions import open_session

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact


class Load(Evaluator):
    """``open_s``: seconds to open the model in a session on the target (compilation included,
    for runtimes that compile when they load)."""

    name = "load"
    summary = "Opens the model in a session on the target (and runs nothing): a model the target cannot load fails here."
    version = "1"
    metrics = ("open_s",)
    default_timeout_s = 1800.0

    class Config(EvaluatorConfig):
        pass

    def evaluate(self, model: ModelArtifact, ctx: EvalContext) -> MetricResult:
        start = time.perf_counter()
        session = open_session(ctx, model)
        try:
            elapsed = time.perf_counter() - start
            details = {"target": ctx.target.id, "runtime": ctx.target.runtime, **dict(session.details)}
        finally:
            session.close()
        return MetricResult(values={"open_s": elapsed}, details=details)
