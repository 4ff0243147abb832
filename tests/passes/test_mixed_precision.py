"""mixed_precision on the tiny genai decoder (tests/genai_models.py): its plan, followed by
int4_weights, keeps the chosen MatMuls at 8 bits, and the logits' error lies between the all-4-bit
and the all-8-bit model's. onnxruntime runs every model; no mocks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from pydantic import ValidationError

from engine.core import ModelArtifact, PassContext, PassResult
from engine.core.data import Dataset
from passes.quantize.int4_weights import Int4Weights
from passes.quantize.mixed_precision import MixedPrecision
from passes.quantize.nbits_plan import read_metadata
from passes.quantize.precision_select import cache_dims, decoder_feeds

PROMPTS = np.random.default_rng(0).integers(1, 100, size=(4, 12)).astype(np.int64)
CALIBRATION = Dataset(inputs={"input_ids": PROMPTS})


def _step(pass_cls: type, model: ModelArtifact, root: Path, **config: object) -> PassResult:
    (root / "work").mkdir(parents=True)
    ctx = PassContext(step_id=pass_cls.name, workdir=root / "work", output_dir=root / "out", datasets={"cal": lambda: CALIBRATION})
    return pass_cls(pass_cls.Config(**config))(model, ctx)


def _bits(model: ModelArtifact) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for node in onnx.load(str(model.model_file)).graph.node:
        if node.op_type == "MatMulNBits":
            out[node.name.removesuffix("_Q4").removesuffix("_Q8")] = next(a.i for a in node.attribute if a.name == "bits")
        elif node.op_type == "MatMul" and node.name.endswith(("proj/MatMul", "lm_head/MatMul")):
            out[node.name] = None
    return out


def _logits(model: ModelArtifact) -> np.ndarray:
    proto = onnx.load(str(model.model_file))
    session = ort.InferenceSession(str(model.model_file), providers=["CPUExecutionProvider"])
    return np.concatenate(
        [session.run(["logits"], decoder_feeds(proto, {"input_ids": row[None]}, cache_dims(model.path)))[0] for row in PROMPTS]
    )


def _error(reference: np.ndarray, value: np.ndarray) -> float:
    return float(np.linalg.norm(value - reference) / np.linalg.norm(reference))


def test_k_quant_mixed_keeps_lm_head_qkv_and_down_at_8_bits(tiny_genai, tmp_path: Path) -> None:
    plan = _step(MixedPrecision, tiny_genai.fp32, tmp_path / "mp", algorithm="k_quant_mixed")
    assert plan.model.format == "genai"
    assert read_metadata(onnx.load(str(plan.model.model_file))) is not None
    quantized = _step(Int4Weights, plan.model, tmp_path / "q", algorithm="k_quant")
    bits = _bits(quantized.model)
    # two layers, Olive's rule (layer < n/8, layer >= 7n/8, or (layer - n//8) % 3 == 2) picks layer 0 only
    assert bits["/model/layers.0/attn/qkv_proj/MatMul"] == bits["/model/layers.0/mlp/down_proj/MatMul"] == 8
    assert bits["/model/layers.1/attn/qkv_proj/MatMul"] == bits["/model/layers.1/mlp/down_proj/MatMul"] == 4
    assert bits["/model/layers.0/mlp/up_proj/MatMul"] == bits["/model/layers.0/attn/o_proj/MatMul"] == 4
    assert bits["/lm_head/MatMul"] == 8


def test_roles_with_high_bits_16_keep_nodes_float(tiny_genai, tmp_path: Path) -> None:
    plan = _step(MixedPrecision, tiny_genai.fp32, tmp_path / "mp", algorithm="roles", roles=["mlp_down"], last_layers=1, high_bits=16)
    assert plan.details["chosen"] == ["/model/layers.1/mlp/down_proj/MatMul"]
    bits = _bits(_step(Int4Weights, plan.model, tmp_path / "q").model)
    assert bits["/model/layers.1/mlp/down_proj/MatMul"] is None
    assert bits["/model/layers.0/mlp/down_proj/MatMul"] == 4


@pytest.mark.parametrize("algorithm", ["output_error", "weight_snr"])
def test_scored_mixed_precision_errs_between_all_4_and_all_8_bits(tiny_genai, tmp_path: Path, algorithm: str) -> None:
    reference = _logits(tiny_genai.fp32)
    all4 = _error(reference, _logits(_step(Int4Weights, tiny_genai.fp32, tmp_path / "q4").model))
    all8 = _error(reference, _logits(_step(Int4Weights, tiny_genai.fp32, tmp_path / "q8", bits=8).model))
    config: dict[str, object] = {"algorithm": algorithm, "ratio": 0.5}
    if algorithm == "output_error":
        config["calibration"] = "cal"
    plan = _step(MixedPrecision, tiny_genai.fp32, tmp_path / "mp", **config)
    assert plan.details["chosen"] and 0.4 <= plan.details["low_bit_share"] <= 0.5
    mixed = _step(Int4Weights, plan.model, tmp_path / "qm")
    assert set(_bits(mixed.model).values()) == {4, 8}
    error = _error(reference, _logits(mixed.model))
    assert all8 < error < all4, (all8, error, all4)


def test_output_error_ranks_the_lm_head_and_down_projections_by_measurement(tiny_genai, tmp_path: Path) -> None:
    plan = _step(MixedPrecision, tiny_genai.fp32, tmp_path / "mp", algorithm="output_error", ratio=0.5, calibration="cal")
    scores = plan.details["scores"]
    assert len(scores) == 11 and all(score > 0 for score in scores.values())  # 5 MatMuls x 2 layers + lm_head


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"algorithm": "weight_snr"}, "needs ratio"),
        ({"algorithm": "k_quant_last", "ratio": 0.5}, "ratio is used by"),
        ({"algorithm": "output_error", "ratio": 0.5}, "calibration is needed by"),
        ({"algorithm": "weight_snr", "ratio": 1.5}, "less than 1"),
    ],
)
def test_config_errors(config: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        MixedPrecision.Config(**config)
