"""Jobs that are not timed share the cores with other jobs: their sessions are opened on the
target's untimed twin (``Target.untimed``), which for ONNX Runtime lets idle threads sleep."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from test_onnxruntime_settings import make_target, mlp  # noqa: F401 (a fixture)

from engine.core.artifact import ModelArtifact
from engine.execute import worker
from targets.onnxruntime.target import ALLOW_SPINNING


def test_an_untimed_job_lets_idle_threads_sleep_unless_the_config_says(mlp: ModelArtifact) -> None:  # noqa: F811
    target = make_target()
    untimed = target.untimed()
    assert untimed.session_options().get_session_config_entry(ALLOW_SPINNING) == "0"
    assert ALLOW_SPINNING not in target.config_entries()  # the target as written, for timing, is left as it was
    assert untimed.fingerprint() == target.fingerprint()  # the same outputs: results stay shared
    assert untimed.open_session(mlp).details["config_entries"] == {ALLOW_SPINNING: "0"}
    spinning = make_target(allow_spinning=True)
    assert spinning.untimed().session_options().get_session_config_entry(ALLOW_SPINNING) == "1"


@pytest.mark.parametrize("timing", [False, True])
def test_a_pass_measuring_its_models_opens_them_untimed_unless_the_evaluator_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timing: bool
) -> None:
    seen = []

    class Evaluator:
        class Config:
            def __init__(self, **options: object) -> None:
                pass

        def __init__(self, config: object) -> None:
            pass

        def evaluate(self, model: object, ctx: object) -> None:
            seen.append(ctx.target.config_entries())  # type: ignore[attr-defined]

    Evaluator.timing = timing  # type: ignore[attr-defined]
    Evaluator.deployed_sessions = False  # type: ignore[attr-defined]
    monkeypatch.setattr(worker.registry, "load", lambda kind, name: Evaluator)
    job = SimpleNamespace(step_id="q", evaluations={"fidelity": SimpleNamespace(plugin="fidelity", config={})})
    measure = worker._measure(job, make_target(), None, {}, tmp_path, tmp_path)  # type: ignore[arg-type]
    measure("fidelity", None)
    assert seen == [{} if timing else {ALLOW_SPINNING: "0"}]
