"""The latency evaluator on real onnxruntime sessions of a tiny model."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pydantic
import pytest

from engine.core.data import Dataset
from engine.core.errors import EvaluationError
from evaluators._rounds import Arm
from evaluators.latency import Latency

TINY_VOCAB = 50  # the tiny models embed 50 token ids


def latency(**options: object) -> Latency:
    options.setdefault("int_high", TINY_VOCAB)
    return Latency(Latency.Config(**options))


def test_returns_every_declared_metric_with_ordered_percentiles(make_model, make_ctx) -> None:
    result = latency(runs=20, warmup=2).evaluate(make_model().artifact, make_ctx())
    assert set(result.values) == set(Latency.metrics)
    v = result.values
    assert 0 < v["min_ms"] <= v["p50_ms"] <= v["p90_ms"] <= v["p95_ms"] <= v["p99_ms"] <= v["max_ms"]
    assert v["std_ms"] >= 0
    assert v["load_ms"] > 0
    assert v["throughput_per_s"] == pytest.approx(1 / (v["mean_ms"] / 1e3))


def test_details_record_runs_batch_and_sequence(make_model, make_ctx) -> None:
    result = latency(runs=20, runs_per_round=5, min_rounds=4, sessions=2, warmup=3, batch_size=2, sequence_length=7).evaluate(
        make_model().artifact, make_ctx()
    )
    d = result.details
    assert d["runs"] == 20
    assert d["rounds"] == 4
    assert d["warmup"] == 3
    assert d["batch_size"] == 2
    assert d["sequence_length"] == 7
    assert d["feeds"] == "synthetic"
    assert d["input_shapes"] == {"input_ids": [2, 7], "attention_mask": [2, 7]}
    assert d["session"]["providers"] == ["CPUExecutionProvider"]
    assert d["session"]["intra_op_threads"] == 1
    assert d["load_ms"] == result.values["load_ms"]


def test_throughput_counts_every_sample_of_the_batch(make_model, make_ctx) -> None:
    v = latency(runs=20, warmup=1, batch_size=4, sequence_length=8).evaluate(make_model().artifact, make_ctx()).values
    assert v["throughput_per_s"] == pytest.approx(4 / (v["mean_ms"] / 1e3))


def test_named_dims_set_the_synthetic_shapes(make_model, make_ctx) -> None:
    result = latency(runs=20, warmup=0, dims={"sequence": 5}).evaluate(make_model().artifact, make_ctx())
    assert result.details["input_shapes"]["input_ids"] == [1, 5]


def test_min_time_keeps_running_beyond_runs(make_model, make_ctx) -> None:
    result = latency(runs=1, warmup=0, min_time_s=0.05).evaluate(make_model().artifact, make_ctx())
    assert result.details["runs"] > 1
    assert result.details["total_s"] >= 0.05


def test_feeds_come_from_the_first_samples_of_a_dataset(make_model, make_ctx, token_dataset) -> None:
    data = token_dataset(samples=5, sequence=16)
    result = latency(runs=20, warmup=1, batch_size=2, data="sentences").evaluate(make_model().artifact, make_ctx(sentences=data))
    d = result.details
    assert d["feeds"] == "dataset"
    assert d["input_shapes"] == {"input_ids": [2, 16], "attention_mask": [2, 16]}
    assert d["sequence_length"] == 16  # from the data, not the configured 128


def test_dataset_inputs_beyond_the_model_are_ignored_and_int_width_is_cast(make_model, make_ctx, token_dataset) -> None:
    base = token_dataset(samples=2, sequence=4)
    data = Dataset(
        inputs={
            "input_ids": base.inputs["input_ids"].astype(np.int32),
            "attention_mask": base.inputs["attention_mask"],
            "token_type_ids": np.zeros((2, 4), np.int64),
        }
    )
    result = latency(runs=20, warmup=0, data="d").evaluate(make_model().artifact, make_ctx(d=data))
    assert result.details["input_dtypes"] == {"input_ids": "int64", "attention_mask": "int64"}


def test_a_dataset_lacking_a_model_input_is_an_evaluation_error(make_model, make_ctx) -> None:
    data = Dataset(inputs={"input_ids": np.ones((2, 4), dtype=np.int64)})
    with pytest.raises(EvaluationError, match=r"lacks input.*attention_mask"):
        latency(runs=20, data="d").evaluate(make_model().artifact, make_ctx(d=data))


def test_a_dataset_smaller_than_the_batch_is_an_evaluation_error(make_model, make_ctx, token_dataset) -> None:
    with pytest.raises(EvaluationError, match="fewer than batch_size=4"):
        latency(runs=20, batch_size=4, data="d").evaluate(make_model().artifact, make_ctx(d=token_dataset(samples=3)))


def test_an_undeclared_dataset_is_an_evaluation_error_listing_the_declared(make_model, make_ctx, token_dataset) -> None:
    with pytest.raises(EvaluationError, match="declared: other"):
        latency(runs=20, data="missing").evaluate(make_model().artifact, make_ctx(other=token_dataset()))


def test_a_model_the_runtime_cannot_load_is_an_evaluation_error(tmp_path, make_ctx) -> None:
    from engine.core.artifact import ModelArtifact

    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model.onnx").write_bytes(b"garbage")
    with pytest.raises(EvaluationError, match="could not open"):
        latency(runs=20).evaluate(ModelArtifact.from_folder("onnx", tmp_path / "bad"), make_ctx())


def test_a_run_failure_is_an_evaluation_error_with_the_feed_shapes(make_model, make_ctx) -> None:
    # token ids beyond the 50-entry embedding make the Gather fail inside onnxruntime
    with pytest.raises(EvaluationError, match=r"running the model failed on feeds \(input_ids \[1, 6\] int64"):
        latency(runs=20, sequence_length=6, int_high=10_000).evaluate(make_model().artifact, make_ctx())


def test_config_rejects_zero_runs_and_unknown_keys() -> None:
    with pytest.raises(pydantic.ValidationError):
        Latency.Config(runs=0)
    with pytest.raises(pydantic.ValidationError):
        Latency.Config(repeats=3)


def test_importing_the_evaluators_imports_no_runtime() -> None:
    code = "import sys, evaluators.latency, evaluators.fidelity; print(sorted(m for m in ('numpy', 'onnxruntime', 'transformers') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_startup_is_reported_cold_and_warm(make_model, make_ctx) -> None:
    from evaluators import latency as latency_module

    model = make_model().artifact
    latency_module._OPENED.discard(model.digest)
    result = latency(runs=10, runs_per_round=5, min_rounds=2, sessions=1, warmup=0).evaluate(model, make_ctx())
    v, startup = result.values, result.details["startup"]
    assert {"startup_ms", "startup_warm_ms"} <= set(Latency.metrics)
    assert v["startup_ms"] > 0 and v["startup_warm_ms"] > 0
    assert v["startup_ms"] == v["load_ms"] == startup["cold_ms"]  # load_ms keeps its meaning: the first creation
    assert startup["cold"] is True
    # one block of rounds opened one session: the warm figure is topped up with extra creations
    assert startup["warm_count"] == latency_module.WARM_STARTS == len(startup["warm_samples_ms"])
    assert startup["warm_ms"] == v["startup_warm_ms"] == pytest.approx(float(np.median(startup["warm_samples_ms"])), rel=1e-3)
    again = latency(runs=10, runs_per_round=5, min_rounds=2, sessions=1, warmup=0).evaluate(model, make_ctx())
    assert again.details["startup"]["cold"] is False  # this process opened the model before


def test_warm_startup_uses_every_block_of_rounds(make_model, make_ctx) -> None:
    result = latency(runs=20, runs_per_round=2, min_rounds=5, sessions=5, warmup=0, precision=0.9).evaluate(
        make_model().artifact, make_ctx()
    )
    assert result.details["startup"]["warm_count"] >= max(result.details["sessions"] - 1, 3)


def test_the_prepared_run_is_timed_and_each_models_binding_recorded(tmp_path, make_model) -> None:
    from _fakes import FakeTarget

    from engine.core.evaluator import EvalContext
    from engine.core.target import TargetConfig

    target = FakeTarget(TargetConfig(id="fake", runtime="fake"))
    ctx = EvalContext(target=target, workdir=tmp_path, reference=make_model(seed=1).artifact)
    result = latency(warmup=3, runs=4, runs_per_round=2, sessions=1, min_rounds=2, max_rounds=2, quiet_wait_s=0).evaluate(
        make_model().artifact, ctx
    )
    opened = target.sessions[:2]  # the first block: candidate, reference
    assert all(s.prepared_runs >= 3 + 4 and s.plain_runs == 0 and s.syncs > 0 for s in opened)
    assert result.details["io_binding"] == "bound" and result.details["reference_io_binding"] == "bound"
    assert result.details["reference_target"] == "fake"


def test_a_prepared_run_failure_is_an_evaluation_error_with_the_feed_shapes(tmp_path, make_model) -> None:
    from _fakes import FakeTarget

    from engine.core.evaluator import EvalContext
    from engine.core.target import TargetConfig

    ctx = EvalContext(target=FakeTarget(TargetConfig(id="fake", runtime="fake"), fail=True), workdir=tmp_path)
    with pytest.raises(EvaluationError, match=r"running the model failed on feeds \(x \[1, 4\] float32\): boom"):
        latency(runs=2).evaluate(make_model().artifact, ctx)


def test_the_reference_opens_on_the_reference_target(make_model, make_ctx) -> None:
    from _fakes import RecordingTarget

    from engine.core.target import TargetConfig

    as_written = RecordingTarget(TargetConfig(id="as-written", runtime="recording"))
    ctx = make_ctx(reference=make_model(seed=1).artifact)
    ctx.reference_target = as_written
    result = latency(runs=4, runs_per_round=2, sessions=1, min_rounds=2, max_rounds=2, quiet_wait_s=0).evaluate(make_model().artifact, ctx)
    assert as_written.opened == result.details["sessions"]  # every reference session, none of the candidate's
    assert result.details["reference_target"] == "as-written" and result.details["target"] == "cpu"
    assert result.details["io_binding"] == result.details["reference_io_binding"] == "off"


def test_one_session_with_no_warm_starts_opens_the_model_once_as_a_single_timed_session_would(tmp_path, make_model) -> None:
    from _fakes import FakeTarget

    from engine.core.evaluator import EvalContext
    from engine.core.target import TargetConfig

    target = FakeTarget(TargetConfig(id="fake", runtime="fake"))
    result = latency(warmup=2, runs=10, runs_per_round=2, sessions=1, min_rounds=5, warm_starts=0, compare=False, quiet_wait_s=0).evaluate(
        make_model().artifact, EvalContext(target=target, workdir=tmp_path)
    )
    assert len(target.sessions) == 1 and result.details["sessions"] == 1
    assert result.details["runs"] == 10 and target.sessions[0].prepared_runs == 2 + 10
    assert "startup_warm_ms" not in result.values and result.details["startup"]["warm_count"] == 0
    assert result.values["startup_ms"] > 0


def test_warm_starts_are_topped_up_to_the_number_asked_for(tmp_path, make_model) -> None:
    from _fakes import FakeTarget

    from engine.core.evaluator import EvalContext
    from engine.core.target import TargetConfig

    target = FakeTarget(TargetConfig(id="fake", runtime="fake"))
    result = latency(warmup=0, runs=4, runs_per_round=2, sessions=1, min_rounds=2, warm_starts=5, compare=False, quiet_wait_s=0).evaluate(
        make_model().artifact, EvalContext(target=target, workdir=tmp_path)
    )
    assert len(target.sessions) == 1 + 5 and result.details["startup"]["warm_count"] == 5
    assert result.values["startup_warm_ms"] > 0


def _scripted_arm(monkeypatch: pytest.MonkeyPatch, times_ms: list[float]) -> Arm:
    """An arm over a fake session whose runs 'take' the scripted times (then the last one again)."""
    from _fakes import FakeSession

    arm = Arm("model", FakeSession(fail=False), {"x": np.ones((1, 4), np.float32)})
    script = iter(times_ms)
    last = [times_ms[-1]]

    def timed(runs: int) -> list[int]:
        last[0] = next(script, last[0])
        return [int(last[0] * 1e6)]

    monkeypatch.setattr(arm, "time", timed)
    return arm


def test_the_warm_up_stops_once_three_runs_in_a_row_agree(monkeypatch) -> None:
    # a fresh session: two slow runs, then steady within 10%
    assert _scripted_arm(monkeypatch, [60, 40, 10, 10.5, 10.2]).warm_up_until_steady(20, 0.1) == 5
    # a wider spread than asked never counts as steady: all 20 runs are made
    assert _scripted_arm(monkeypatch, [10, 12] * 10).warm_up_until_steady(20, 0.1) == 20
    assert _scripted_arm(monkeypatch, [10, 12] * 10).warm_up_until_steady(20, 0.25) == 3


def test_a_warm_up_spread_of_zero_makes_every_warm_up_run(monkeypatch) -> None:
    arm = _scripted_arm(monkeypatch, [10.0])
    assert arm.warm_up_until_steady(20, 0.0) == 20
    assert arm.session.prepared_runs == 20  # type: ignore[attr-defined]


def test_the_warm_up_runs_made_are_recorded_per_session(make_model, make_ctx) -> None:
    model = make_model().artifact
    result = latency(warmup=12, runs=20, runs_per_round=5, sessions=2, min_rounds=4).evaluate(model, make_ctx(reference=model))
    warmed = result.details["warmup_runs"]
    assert warmed["most"] == 12 and warmed["spread"] == 0.1
    assert len(warmed["made"]) == 2 * result.details["sessions"]  # reference and candidate, per pair of sessions
    assert all(3 <= made <= 12 for made in warmed["made"])
