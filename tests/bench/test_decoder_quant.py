"""bench/decoder_quant.py's smoke run on the reference decoder's tiny recipe: every method is built
as MatMulNBits through genai_build or int4_weights, scored by ONNX Runtime GenAI, and written under
its key. Minutes to tens of minutes (ten ONNX builds, each scored by GenAI), so it runs only when asked:
``KILN_BENCH_SMOKE=1 python -m pytest tests/bench/test_decoder_quant.py`` (CI keeps to the tiny recipe's
own tests in tests/workflows/test_reference_decoder.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("rtn", "gptq", "gptq_act_order", "quarot_rtn", "quarot_gptq", "selective_mixed_precision", "kquant", "hqq")


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("KILN_BENCH_SMOKE"), reason="the bench's smoke run takes tens of minutes: set KILN_BENCH_SMOKE=1")
def test_the_smoke_run_writes_every_method_with_an_interval(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    env = {**os.environ, "KILN_REFERENCE_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    args = ["--model", "tiny", "--seeds", "2", "--samples", "8", "--windows", "12", "--rounds", "1", "--new-tokens", "8", "--threads", "1"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "decoder_quant.py"), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(out.read_text())
    for key in KEYS:
        entry = figures[key]
        low, high = entry["interval"]
        assert low <= entry["nll_increase"] <= high, key
        assert entry["size_mb"] < figures["fp32"]["size_mb"], key
        assert entry["decode_tokens_per_s"] > 0, key
    assert len(figures["gptq"]["seed_increases"]) == 2 and len(figures["rtn"]["seed_increases"]) == 1
    assert figures["model"]["nll"] < figures["model"]["unigram_nll"]
    # the mixed model holds some 8-bit layers: larger than uniform group 32, smaller than FP32
    assert figures["uniform4_small_groups"]["size_mb"] > figures["rtn"]["size_mb"]
    assert figures["selective_mixed_precision"]["size_mb"] > figures["rtn"]["size_mb"]
