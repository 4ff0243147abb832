"""Timings belong to the host they were measured on: for a GPU target, the GPU model, driver and
CUDA libraries enter the key, so a timing from one GPU is never served for another."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from engine.plan import keys
from evaluators.latency import Latency

FAKE_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=*) echo "NVIDIA {model}, 580.65.06, 81559 MiB, 9.0" ;;
  *) echo "| NVIDIA-SMI 580.65.06    Driver Version: 580.65.06    CUDA Version: 13.0 |" ;;
esac
"""


@pytest.fixture
def fake_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An nvidia-smi on PATH that reports one GPU of the given model."""

    def install(model: str) -> None:
        smi = tmp_path / "bin" / "nvidia-smi"
        smi.parent.mkdir(exist_ok=True)
        smi.write_text(FAKE_SMI.format(model=model))
        smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
        keys.accelerator_fingerprint.cache_clear()

    yield install
    keys.accelerator_fingerprint.cache_clear()


def key_for(device: str) -> str:
    target = {"runtime": "onnxruntime", "version": "1", "options": {"device": device}, "libraries": {}}
    return keys.eval_key(Latency, {}, "m" * 64, "r" * 64, target, {})[0]


def test_the_gpu_reported_by_nvidia_smi_enters_the_fingerprint(fake_gpu) -> None:
    fake_gpu("H100 80GB HBM3")
    found = keys.accelerator_fingerprint()
    assert found["nvidia"] == [
        {"name": "NVIDIA H100 80GB HBM3", "driver_version": "580.65.06", "memory.total": "81559 MiB", "compute_cap": "9.0"}
    ]
    assert found["cuda_driver"] == "13.0"


def test_a_timing_on_another_gpu_gets_another_key(fake_gpu) -> None:
    fake_gpu("H100 80GB HBM3")
    on_h100 = key_for("cuda")
    fake_gpu("H200")
    assert key_for("cuda") != on_h100


def test_cpu_timings_do_not_depend_on_the_gpus_of_the_host(fake_gpu) -> None:
    fake_gpu("H100 80GB HBM3")
    first = key_for("cpu")
    fake_gpu("H200")
    assert key_for("cpu") == first
    assert "accelerators" not in keys.timing_host({"options": {"device": "cpu"}})
