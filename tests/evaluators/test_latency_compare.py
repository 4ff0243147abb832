"""Latency as a comparison: interleaved rounds against the reference, the speedup's interval,
the stopping rule, and the noise guard (with a real busy process beside the measurement)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.core.artifact import ModelArtifact
from evaluators._noise import NoiseMeter
from evaluators.latency import Latency

pytestmark = pytest.mark.alone  # paired timings whose intervals the tests assert on

TINY_VOCAB = 50


def latency(**options: object) -> Latency:
    options.setdefault("int_high", TINY_VOCAB)
    options.setdefault("sequence_length", 64)
    return Latency(Latency.Config(**options))


def build_heavy_model(folder: Path, width: int = 384, layers: int = 6) -> ModelArtifact:
    """The tiny models' inputs and output name, but ``layers`` width x width MatMuls: many times slower."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gather", ["embedding", "input_ids"], ["h0"])]
    inits = [numpy_helper.from_array(rng.standard_normal((TINY_VOCAB, width)).astype(np.float32), "embedding")]
    for i in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((width, width)) / width).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"h{i + 1}"]))
    nodes.append(helper.make_node("Identity", [f"h{layers}"], ["last_hidden_state"]))
    graph = helper.make_graph(
        nodes,
        "heavy",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", width])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    folder.mkdir(parents=True)
    onnx.save_model(model, str(folder / "model.onnx"))
    return ModelArtifact.from_folder("onnx", folder)


@contextmanager
def busy_process() -> Iterator[None]:
    """A child process spinning on one core for as long as the block lasts."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # past the interpreter's start-up: spinning
        yield
    finally:
        hog.kill()
        hog.wait()


def test_a_faster_candidate_shows_a_speedup_above_one_with_its_interval(tmp_path, make_model, make_ctx) -> None:
    heavy = build_heavy_model(tmp_path / "heavy")
    result = latency(warmup=2, runs=20, runs_per_round=5, precision=0.2).evaluate(make_model().artifact, make_ctx(reference=heavy))
    v = result.values
    assert v["speedup"] > 2
    assert v["speedup_low"] <= v["speedup"] <= v["speedup_high"]
    assert v["reference_p50_ms"] > v["p50_ms"]
    assert result.samples["speedup"].statistic == "median"
    assert len(result.samples["speedup"].values) == result.details["rounds"] == v["rounds"]
    assert result.details["method"] == "interleaved rounds against the reference"


def test_a_slower_candidate_shows_a_speedup_below_one(tmp_path, make_model, make_ctx) -> None:
    heavy = build_heavy_model(tmp_path / "heavy")
    result = latency(warmup=2, runs=20, runs_per_round=5, precision=0.2).evaluate(heavy, make_ctx(reference=make_model().artifact))
    assert result.values["speedup_high"] < 0.5


def test_a_model_against_itself_is_about_even(make_model, make_ctx) -> None:
    model = make_model().artifact
    result = latency(warmup=5, runs=50, precision=0.1).evaluate(model, make_ctx(reference=model))
    assert 0.7 < result.values["speedup"] < 1.4


def test_the_reference_is_timed_alone_at_speedup_one(make_model, make_ctx) -> None:
    result = latency(runs=20, runs_per_round=5, min_rounds=4, sessions=2).evaluate(make_model().artifact, make_ctx())
    v = result.values
    assert (v["speedup"], v["speedup_low"], v["speedup_high"]) == (1.0, 1.0, 1.0)
    assert "speedup" not in result.samples
    assert len(result.samples["p50_ms"].values) == 4


def test_without_compare_a_candidate_is_timed_alone_and_reports_no_speedup(tmp_path, make_model, make_ctx) -> None:
    heavy = build_heavy_model(tmp_path / "heavy")
    result = latency(runs=20, compare=False).evaluate(make_model().artifact, make_ctx(reference=heavy))
    assert "speedup" not in result.values
    assert result.details["method"] == "rounds, alone"


def test_a_loose_precision_stops_at_the_minimum_rounds_and_says_why(make_model, make_ctx) -> None:
    # stop_when_slower off: a model against itself can measure either way round on a loaded host
    # (a CI run saw 0.715-0.999 and stopped as "slower" first)
    model = make_model().artifact
    result = latency(runs=1, runs_per_round=20, min_rounds=4, sessions=2, precision=0.9, stop_when_slower=False).evaluate(
        model, make_ctx(reference=model)
    )
    assert result.details["rounds"] == 4
    assert result.details["stopped_because"] == "interval within ±90%"


def test_an_unreachable_precision_stops_at_max_rounds(tmp_path, make_model, make_ctx) -> None:
    heavy = build_heavy_model(tmp_path / "heavy", width=64, layers=2)
    # stop_when_slower off: two models this close can measure either way round on a loaded host
    result = latency(runs=1, runs_per_round=3, min_rounds=2, max_rounds=4, sessions=1, precision=1e-9, stop_when_slower=False).evaluate(
        make_model().artifact, make_ctx(reference=heavy)
    )
    assert result.details["rounds"] == 4
    assert result.details["stopped_because"] == "max_rounds (4) reached"


def test_the_noise_meter_sees_another_process_use_a_core() -> None:
    meter = NoiseMeter()
    with busy_process():
        meter.start()
        sum(range(2_000_000))  # this process's own work is not counted as others'
        time.sleep(0.6)
        load = meter.stop()
    assert load.others_cores > 0.5
    assert load.busy(0.3)


def test_rounds_taken_while_the_machine_is_busy_are_thrown_away_then_kept_and_flagged(tmp_path, make_model, make_ctx) -> None:
    heavy = build_heavy_model(tmp_path / "heavy", width=128, layers=2)
    with busy_process():
        result = latency(runs=1, runs_per_round=40, min_rounds=3, precision=0.5, quiet_wait_s=1.5).evaluate(
            make_model().artifact, make_ctx(reference=heavy)
        )
    noise = result.details["noise"]
    assert noise["rounds_thrown_away"] >= 1  # first re-measured after waiting for quiet
    assert noise["loaded"] is True  # the busy process never stopped: the rounds were kept, flagged
    assert noise["others_cores_max"] > 0.5
    assert result.values["others_cores"] == pytest.approx(noise["others_cores_mean"])


def test_config_refuses_max_rounds_below_min_rounds_and_bad_precision() -> None:
    import pydantic

    with pytest.raises(pydantic.ValidationError, match="max_rounds"):
        Latency.Config(min_rounds=10, max_rounds=5)
    for bad in (0, -0.1, 1.5, float("nan")):
        with pytest.raises(pydantic.ValidationError):
            Latency.Config(precision=bad)
    with pytest.raises(pydantic.ValidationError):
        Latency.Config(confidence=1.0)
    with pytest.raises(pydantic.ValidationError):
        Latency.Config(max_time_s=0)


def test_rounds_are_spread_over_fresh_sessions_and_grouped_by_them(tmp_path, make_model, make_ctx) -> None:
    heavy = build_heavy_model(tmp_path / "heavy", width=64, layers=2)
    # max_rounds = min_rounds: a noisy machine cannot ask for more rounds (and so a fourth session)
    result = latency(runs=1, runs_per_round=5, min_rounds=6, max_rounds=6, sessions=3, precision=0.9).evaluate(
        make_model().artifact, make_ctx(reference=heavy)
    )
    assert result.details["sessions"] == 3
    sample = result.samples["speedup"]
    assert sample.groups == [0, 0, 1, 1, 2, 2]
    assert result.samples["p50_ms"].groups == sample.groups


def test_a_candidate_clearly_slower_stops_once_its_whole_interval_is_below_one(tmp_path, make_model, make_ctx) -> None:
    # the precision asked is out of reach: only the side of 1 the interval lies on can end the rounds early
    heavy = build_heavy_model(tmp_path / "heavy", width=256, layers=4)
    options = {"runs": 1, "runs_per_round": 3, "min_rounds": 4, "max_rounds": 30, "sessions": 2, "precision": 1e-9}
    early = latency(**options).evaluate(heavy, make_ctx(reference=make_model().artifact))
    assert early.values["speedup_high"] < 1
    assert early.details["stopped_because"].startswith("slower than the model compared with")
    assert early.details["rounds"] < 30
    full = latency(**options, stop_when_slower=False).evaluate(heavy, make_ctx(reference=make_model().artifact))
    assert full.details["stopped_because"] == "max_rounds (30) reached"


def test_a_slower_candidate_stops_before_the_runs_asked_while_a_faster_one_makes_them(tmp_path, make_model, make_ctx) -> None:
    # decided at the least rounds: 4 rounds of 3 runs, far below the 60 runs asked
    heavy = build_heavy_model(tmp_path / "heavy", width=256, layers=4)
    options = {"runs": 60, "runs_per_round": 3, "min_rounds": 4, "max_rounds": 40, "sessions": 2, "precision": 0.5}
    slower = latency(**options).evaluate(heavy, make_ctx(reference=make_model().artifact))
    assert slower.values["speedup_high"] < 1
    assert slower.details["stopped_because"].startswith("slower than the model compared with")
    assert slower.details["runs"] < 60
    faster = latency(**options).evaluate(make_model().artifact, make_ctx(reference=heavy))
    assert faster.values["speedup_low"] > 1
    assert faster.details["runs"] >= 60


def test_a_faster_candidate_is_still_measured_to_the_precision_asked(tmp_path, make_model, make_ctx) -> None:
    heavy = build_heavy_model(tmp_path / "heavy", width=256, layers=4)
    options = {"runs": 1, "runs_per_round": 3, "min_rounds": 4, "max_rounds": 12, "sessions": 2, "precision": 1e-9}
    result = latency(**options).evaluate(make_model().artifact, make_ctx(reference=heavy))
    assert result.values["speedup_low"] > 1
    assert result.details["stopped_because"] == "max_rounds (12) reached"


def test_a_candidate_faster_beyond_the_margin_asked_stops_once_its_whole_interval_is_above_it(tmp_path, make_model, make_ctx) -> None:
    # the rule the engine sets where a runoff ranks the faster candidates (engine.execute.evaluation.to_the_decision)
    heavy = build_heavy_model(tmp_path / "heavy", width=256, layers=4)
    options = {"runs": 1, "runs_per_round": 3, "min_rounds": 4, "max_rounds": 30, "sessions": 2, "precision": 1e-9}
    early = latency(**options, stop_when_faster_than=1.1).evaluate(make_model().artifact, make_ctx(reference=heavy))
    assert early.values["speedup_low"] > 1.1
    assert early.details["stopped_because"].startswith("faster than the model compared with by more than 1.1x")
    assert early.details["rounds"] < 30
    # a margin the candidate does not clear decides nothing: measured to the rounds' end
    unreached = latency(**options, stop_when_faster_than=1000.0).evaluate(make_model().artifact, make_ctx(reference=heavy))
    assert unreached.details["stopped_because"] == "max_rounds (30) reached"


def test_a_candidate_as_fast_as_its_reference_within_the_margin_stops_there(make_model, make_ctx) -> None:
    # the rule the engine sets where select.tie_within is set: equivalent within it, nothing more to decide
    # (stop_when_slower off: a model against itself can measure either way round on a loaded host)
    options = {
        "runs": 1,
        "runs_per_round": 3,
        "min_rounds": 4,
        "max_rounds": 30,
        "sessions": 2,
        "precision": 1e-9,
        "stop_when_slower": False,
    }
    same = make_model().artifact
    early = latency(**options, stop_when_within=0.5).evaluate(same, make_ctx(reference=make_model().artifact))
    assert early.details["stopped_because"].startswith("as fast as the model compared with, within 50%"), early.details["stopped_because"]
    assert early.details["rounds"] < 30 and 1 / 1.5 <= early.values["speedup_low"] <= early.values["speedup_high"] <= 1.5
    assert (
        latency(**options).evaluate(same, make_ctx(reference=make_model().artifact)).details["stopped_because"] == "max_rounds (30) reached"
    )
