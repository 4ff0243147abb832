"""Latency on a CUDA target, for real: runs only where onnxruntime has the CUDA execution
provider and an NVIDIA GPU answers; skipped cleanly elsewhere (CI has no GPU)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_latency_compare import build_heavy_model

from engine.core.evaluator import EvalContext
from engine.plan import keys
from evaluators.latency import Latency
from targets.onnxruntime import OnnxRuntimeTarget


def _cuda_available() -> bool:
    try:
        import onnxruntime
    except ImportError:
        return False
    return "CUDAExecutionProvider" in onnxruntime.get_available_providers() and shutil.which("nvidia-smi") is not None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda_available(), reason="no NVIDIA GPU with onnxruntime's CUDA provider here")]


@pytest.fixture
def cuda_ctx(tmp_path: Path):
    target = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="gpu", runtime="onnxruntime", device="cuda"))

    def make(reference):
        return EvalContext(target=target, workdir=tmp_path, reference=reference)

    return make


def test_a_gpu_speedup_is_stable_from_one_evaluation_to_the_next(tmp_path, cuda_ctx) -> None:
    heavy = build_heavy_model(tmp_path / "heavy", width=1024, layers=12)
    light = build_heavy_model(tmp_path / "light", width=1024, layers=3)
    latency = Latency(Latency.Config(int_high=50, sequence_length=128, warmup=50, runs=200, runs_per_round=20))
    first = latency.evaluate(light, cuda_ctx(heavy))
    second = latency.evaluate(light, cuda_ctx(heavy))
    assert first.details["session"]["providers"][0] == "CUDAExecutionProvider"
    for result in (first, second):
        assert result.values["speedup_low"] > 1.5
        assert result.details["interval_half_width"] <= 0.05 or result.details["stopped_because"].startswith("max")
    # the two evaluations' intervals agree: the ratio does not wander from run to run
    assert first.values["speedup_low"] <= second.values["speedup_high"]
    assert second.values["speedup_low"] <= first.values["speedup_high"]
    print(
        f"\nGPU speedup, evaluation 1: {first.values['speedup']:.3f} [{first.values['speedup_low']:.3f}, {first.values['speedup_high']:.3f}] "
        f"(candidate p50 {first.values['p50_ms']:.3f} ms, reference {first.values['reference_p50_ms']:.3f} ms); "
        f"evaluation 2: {second.values['speedup']:.3f} [{second.values['speedup_low']:.3f}, {second.values['speedup_high']:.3f}] "
        f"(candidate p50 {second.values['p50_ms']:.3f} ms, reference {second.values['reference_p50_ms']:.3f} ms)"
    )


def test_a_gpu_timing_key_names_the_gpu() -> None:
    keys.accelerator_fingerprint.cache_clear()
    host = keys.timing_host({"options": {"device": "cuda"}})
    assert host["accelerators"]["nvidia"], host
    assert host["accelerators"]["nvidia"][0]["name"].startswith("NVIDIA")
    print(f"\nGPU fingerprint: {host['accelerators']}")
