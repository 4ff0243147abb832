"""The throughput evaluator: real ONNX Runtime sessions on a tiny model (threads and sessions),
the comparison with the reference, and a fake runtime for failures and the prepared run."""

from __future__ import annotations

import pydantic
import pytest
from _fakes import FakeTarget, RecordingTarget

from engine.core.errors import EvaluationError
from engine.core.evaluator import EvalContext
from engine.core.target import Session, TargetConfig
from engine.registry import load
from evaluators.latency import Latency
from evaluators.throughput import Throughput

QUICK = {"window_s": 0.05, "min_windows": 2, "max_windows": 4, "sessions": 1, "warmup": 2, "quiet_wait_s": 0.0, "int_high": 50}


def throughput(**options: object) -> Throughput:
    return Throughput(Throughput.Config(**{**QUICK, "sequence_length": 16, **options}))


def test_the_reference_alone_gives_every_metric_and_speedup_one(make_model, make_ctx) -> None:
    result = throughput(batch_size=2).evaluate(make_model().artifact, make_ctx())
    v = result.values
    assert set(v) == set(Throughput.metrics)
    assert v["speedup"] == v["speedup_low"] == v["speedup_high"] == 1.0
    assert v["reference_items_per_s"] == v["items_per_s"]
    assert v["items_per_s"] == pytest.approx(2 * v["requests_per_s"])
    assert 0 < v["p50_ms"] <= v["p90_ms"] <= v["p99_ms"]
    assert v["windows"] == 2
    d = result.details
    assert d["method"] == "windows, alone"
    assert (d["mode"], d["concurrency"], d["threads"], d["sessions_per_model"]) == ("threads", 1, 1, 1)
    assert d["io_binding"] == "off"
    assert d["input_shapes"] == {"input_ids": [2, 16], "attention_mask": [2, 16]}
    assert d["requests"] >= 2
    # what the engine's summary of timings taken under load reads (as latency's)
    assert set(d["noise"]) >= {"others_cores_mean", "others_cores_max", "busy_rounds_kept", "loaded"}


def test_one_request_in_flight_serves_about_batch_over_latency(make_model, make_ctx) -> None:
    model = make_model().artifact
    served = throughput(window_s=0.2).evaluate(model, make_ctx()).values
    timed = Latency(Latency.Config(warmup=2, runs=20, runs_per_round=5, sequence_length=16, int_high=50, quiet_wait_s=0)).evaluate(
        model, make_ctx()
    )
    expected = 1000 / timed.values["p50_ms"]
    # the same order of magnitude: a thread, a clock and Python's loop cost a tiny model some time
    assert expected / 10 < served["items_per_s"] < expected * 10


def test_two_threads_share_one_session(make_model, make_ctx) -> None:
    result = throughput(concurrency=2).evaluate(make_model().artifact, make_ctx())
    d = result.details
    assert (d["mode"], d["concurrency"], d["threads"], d["sessions_per_model"]) == ("threads", 2, 2, 1)
    assert result.values["items_per_s"] > 0


def test_sessions_mode_opens_one_session_per_thread(make_model, make_ctx) -> None:
    result = throughput(concurrency=2, mode="sessions").evaluate(make_model().artifact, make_ctx())
    d = result.details
    assert (d["mode"], d["threads"], d["sessions_per_model"]) == ("sessions", 2, 2)
    assert d["io_binding"] == "off"  # ONNX Runtime on the CPU: prepare is a plain run


def test_compared_with_the_reference_gives_the_speedup_and_its_interval(tmp_path, make_model, make_ctx) -> None:
    from test_latency_compare import build_heavy_model

    heavy = build_heavy_model(tmp_path / "heavy", width=256, layers=4)
    result = throughput(window_s=0.1, sequence_length=32).evaluate(make_model().artifact, make_ctx(reference=heavy))
    v = result.values
    assert v["speedup"] > 1.5
    assert v["speedup_low"] <= v["speedup"] <= v["speedup_high"]
    assert v["reference_items_per_s"] < v["items_per_s"]
    assert result.samples["speedup"].statistic == "median"
    assert len(result.samples["speedup"].values) == v["windows"]
    assert result.details["method"] == "alternating windows against the reference"
    assert result.details["reference_io_binding"] == "off"
    assert result.details["reference_target"] == "cpu"


def test_compare_false_times_the_candidate_alone(make_model, make_ctx) -> None:
    result = throughput(compare=False).evaluate(make_model().artifact, make_ctx(reference=make_model(seed=1).artifact))
    assert "speedup" not in result.values
    assert result.details["method"] == "windows, alone"


def test_the_reference_opens_on_the_reference_target(tmp_path, make_model, make_ctx) -> None:
    opened = RecordingTarget(TargetConfig(id="as-written", runtime="recording"))
    ctx = make_ctx(reference=make_model(seed=1).artifact)
    ctx.reference_target = opened
    result = throughput().evaluate(make_model().artifact, ctx)
    assert opened.opened == result.details["sessions"] >= 1  # threads: one reference session per opening
    assert result.details["reference_target"] == "as-written"
    assert result.details["target"] == "cpu"


def test_the_registry_knows_it_and_it_pairs_items_per_s_with_the_speedup() -> None:
    assert load("evaluators", "throughput") is Throughput
    assert Throughput.timing and Throughput.needs_reference
    assert Throughput.paired_metrics["items_per_s"] == "speedup"


@pytest.mark.parametrize(
    "options",
    [{"window_s": 0}, {"window_s": -1.0}, {"concurrency": 0}, {"mode": "processes"}, {"min_windows": 5, "max_windows": 3}, {"windos": 3}],
)
def test_bad_config_is_rejected(options) -> None:
    with pytest.raises(pydantic.ValidationError):
        Throughput.Config(**options)


def test_a_failing_request_is_an_evaluation_error(tmp_path, make_model) -> None:
    ctx = EvalContext(target=FakeTarget(TargetConfig(id="fake", runtime="fake"), fail=True), workdir=tmp_path)
    with pytest.raises(EvaluationError, match=r"running the model failed on feeds \(x \[1, 4\] float32\): boom"):
        throughput(concurrency=2).evaluate(make_model().artifact, ctx)


def test_sessions_mode_runs_the_prepared_call_and_synchronizes(tmp_path, make_model) -> None:
    target = FakeTarget(TargetConfig(id="fake", runtime="fake"))
    ctx = EvalContext(target=target, workdir=tmp_path)
    result = throughput(concurrency=2, mode="sessions").evaluate(make_model().artifact, ctx)
    assert result.details["io_binding"] == "bound"
    sessions = target.sessions
    assert len(sessions) == 2 and all(s.prepared_runs > 0 and s.plain_runs == 0 and s.syncs > 0 for s in sessions)
    assert result.details["threads"] == 2


def test_openvino_threads_use_one_request_each(make_model, make_ctx) -> None:
    pytest.importorskip("openvino")
    from targets.openvino import OpenVinoSession, OpenVinoTarget

    if OpenVinoSession.concurrent is Session.concurrent:  # one infer request shared by every thread
        pytest.skip("OpenVINO sessions do not give each thread its own infer request (Session.concurrent) yet")

    target = OpenVinoTarget(OpenVinoTarget.Config(id="ov", runtime="openvino"))
    ctx = make_ctx()
    ctx.target = target
    result = throughput(concurrency=2).evaluate(make_model().artifact, ctx)
    assert result.details["threads"] == 2 and result.values["items_per_s"] > 0


def test_openvino_sessions_mode_serves_from_one_session_per_thread(make_model, make_ctx) -> None:
    pytest.importorskip("openvino")
    from targets.openvino import OpenVinoTarget

    ctx = make_ctx()
    ctx.target = OpenVinoTarget(OpenVinoTarget.Config(id="ov", runtime="openvino"))
    result = throughput(concurrency=2, mode="sessions").evaluate(make_model().artifact, ctx)
    assert (result.details["threads"], result.details["sessions_per_model"]) == (2, 2)
    assert result.values["items_per_s"] > 0 and result.values["speedup"] == 1.0
