"""selective_mixed_precision (passes/torch_quant): Olive's presets by layer, the SNR and
KL-divergence-gradient rankings on tiny random Llamas, and the choice carried through rtn / gptq
into the checkpoint's overrides and genai_build's 8-bit MatMulNBits."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from decoder_passes import run_pass
from decoders import TEXT
from test_torch_quant import _decoder

from engine.core import ModelArtifact, PassContext, PassResult
from engine.core.data import Dataset
from passes.generate.genai_build import GenaiBuild
from passes.torch_quant import _sensitivity as sens
from passes.torch_quant._pass import merge_overrides
from passes.torch_quant._quantize import quantize_linear_layers
from passes.torch_quant.gptq import Gptq
from passes.torch_quant.quarot import QuaRot
from passes.torch_quant.rtn import Rtn
from passes.torch_quant.selective_mixed_precision import SelectiveMixedPrecision

SENSITIVE = "model.layers.1.mlp.gate_proj"


def _llama(layers: int = 2, seed: int = 0, **extra: Any) -> tuple[torch.nn.Module, Any]:
    return _decoder("llama", seed, layers, **extra)


def _sensitive_llama() -> tuple[torch.nn.Module, Any]:
    """A Llama whose layer-1 gate_proj has one large weight per group of 32 on an input feature the
    norm before it zeroes: the float model ignores them, but at 4 bits they stretch each group's
    grid so far that the other weights round to zero (the MLP of layer 1 is gone)."""
    model, tok = _llama(initializer_range=0.1)
    with torch.no_grad():
        model.model.layers[1].post_attention_layernorm.weight[::32] = 0.0
        dict(model.named_modules())[SENSITIVE].weight[:, ::32] = 5.0
    return model, tok


def _save(model: torch.nn.Module, tok: Any, folder: Path) -> ModelArtifact:
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return ModelArtifact.from_folder("hf", folder)


def _calibration(tok: Any) -> Dataset:
    rows = [tok(line)["input_ids"][:32] for line in TEXT.splitlines() if line.strip()]
    width = max(len(r) for r in rows)
    ids = np.array([r + [0] * (width - len(r)) for r in rows], dtype=np.int64)
    mask = np.array([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=np.int64)
    return Dataset(inputs={"input_ids": ids, "attention_mask": mask})


def _run(model: ModelArtifact, root: Path, tok: Any, pass_cls: Any = SelectiveMixedPrecision, **config: Any) -> PassResult:
    (root / "work").mkdir(parents=True, exist_ok=True)
    ctx = PassContext(step_id=pass_cls.name, workdir=root / "work", output_dir=root / "out", datasets={"calib": lambda: _calibration(tok)})
    return pass_cls(pass_cls.Config(**config))(model, ctx)


def _info(result: PassResult) -> dict[str, Any]:
    info: dict[str, Any] = json.loads((result.model.path / "config.json").read_text())["mixed_precision_info"]
    return info


def _olive_k_quant(layers: int, algorithm: str) -> set[str]:
    """Olive's get_k_quant_config, written out for a Llama."""
    chosen = {"lm_head"}
    if algorithm == "k_quant_last":
        return chosen
    for i in range(layers):
        if not (i < layers / 8 or i >= 7 * layers / 8 or ((i - layers // 8) % 3 == 2)):
            continue
        if algorithm == "k_quant_mixed":
            chosen |= {f"model.layers.{i}.self_attn.{p}_proj" for p in "qkv"}
        chosen.add(f"model.layers.{i}.mlp.down_proj")
    return chosen


@pytest.mark.parametrize("layers", [2, 8, 13])
@pytest.mark.parametrize("algorithm", ["k_quant_last", "k_quant_down", "k_quant_mixed"])
def test_presets_choose_the_modules_olives_rule_chooses(algorithm: str, layers: int, tmp_path: Path) -> None:
    model, tok = _llama(layers)
    result = run_pass(SelectiveMixedPrecision, _save(model, tok, tmp_path / "hf"), tmp_path, algorithm=algorithm)
    info = _info(result)
    assert info["default"] == {"bits": 4}
    assert info["overrides"] == {name: {"bits": 8} for name in _olive_k_quant(layers, algorithm)}
    assert result.details["chosen"] == sorted(_olive_k_quant(layers, algorithm))


def test_the_output_keeps_the_float_weights(tmp_path: Path) -> None:
    model, tok = _llama()
    source = _save(model, tok, tmp_path / "hf")
    result = run_pass(SelectiveMixedPrecision, source, tmp_path, algorithm="k_quant_last")
    assert (result.model.path / "model.safetensors").read_bytes() == (source.path / "model.safetensors").read_bytes()
    assert (result.model.path / "tokenizer.json").is_file()


def test_snr_promotes_the_weights_with_outliers_first(tmp_path: Path) -> None:
    model, tok = _sensitive_llama()
    result = run_pass(SelectiveMixedPrecision, _save(model, tok, tmp_path / "hf"), tmp_path, algorithm="snr", ratio=0.95, group_size=32)
    scores = result.details["scores"]
    assert max(scores, key=scores.get) == SENSITIVE
    info = _info(result)
    assert info["default"] == {"bits": 4, "group_size": 32, "symmetric": False}
    assert info["overrides"][SENSITIVE] == {"bits": 8, "group_size": 32, "symmetric": False}


def test_kld_gradient_picks_the_module_whose_quantization_changes_the_output_most(tmp_path: Path) -> None:
    model, tok = _sensitive_llama()
    result = _run(
        _save(model, tok, tmp_path / "hf"), tmp_path, tok, algorithm="kld_gradient", ratio=0.9, group_size=32, calibration="calib",
        samples=8, sequence_length=32,
    )  # fmt: skip
    scores = result.details["scores"]
    ranked = sorted(scores, key=scores.get, reverse=True)
    assert ranked[0] == SENSITIVE and scores[ranked[0]] > 3 * scores[ranked[1]], scores
    assert SENSITIVE in result.details["chosen"]
    # q/k/v are one unit: all three promoted, or none
    for layer in (0, 1):
        qkv = {f"model.layers.{layer}.self_attn.{p}_proj" in result.details["chosen"] for p in "qkv"}
        assert len(qkv) == 1
    # the measured truth: quantizing that module alone moves the output distribution most
    windows = [torch.tensor([tok(line)["input_ids"][:32]]) for line in TEXT.splitlines() if line.strip()][:8]
    low = sens.QuantSpec(4, 32, False)
    units = sens.selection_units(sens.candidates(model))

    def kl_when_quantized(unit: str) -> float:
        quantized = copy.deepcopy(model)
        layers = dict(quantized.named_modules())
        with torch.no_grad():
            for member in units[unit]:
                layers[member.node].weight.data = sens.fake_quantized(layers[member.node].weight.data, low)
            return sum(float(sens.kl_div(quantized(input_ids=w).logits, model(input_ids=w).logits).mean()) for w in windows)

    measured = {unit: kl_when_quantized(unit) for unit in units}
    assert max(measured, key=measured.get) == SENSITIVE


def test_the_chain_into_rtn_writes_8_bit_overrides_exactly_on_the_chosen_modules(tmp_path: Path) -> None:
    model, tok = _llama(8)
    chosen = run_pass(SelectiveMixedPrecision, _save(model, tok, tmp_path / "hf"), tmp_path / "smp", algorithm="k_quant_mixed")
    quantized = run_pass(Rtn, chosen.model, tmp_path / "rtn", group_size=32, lm_head=True)
    quant = json.loads((quantized.model.path / "config.json").read_text())["quantization_config"]
    assert quant["bits"] == 4
    assert set(quant["overrides"]) == set(chosen.details["chosen"])
    assert all(o == {"bits": 8, "group_size": 32, "symmetric": False} for o in quant["overrides"].values())
    assert any("mixed_precision_info" in note for note in quantized.notes)


def test_the_steps_own_overrides_win_over_the_inputs(tmp_path: Path) -> None:
    model, tok = _llama(8)
    chosen = run_pass(SelectiveMixedPrecision, _save(model, tok, tmp_path / "hf"), tmp_path / "smp", algorithm="k_quant_down")
    quantized = run_pass(Rtn, chosen.model, tmp_path / "rtn", group_size=32, lm_head=True, overrides={"re:.*down_proj": {"bits": 4}})
    quant = json.loads((quantized.model.path / "config.json").read_text())["quantization_config"]
    assert set(quant["overrides"]) == {"lm_head"}


def test_quarot_quantizes_the_chosen_modules_at_8_bits(tmp_path: Path) -> None:
    model, tok = _llama(8)
    chosen = run_pass(SelectiveMixedPrecision, _save(model, tok, tmp_path / "hf"), tmp_path / "smp", algorithm="k_quant_down")
    quantized = run_pass(QuaRot, chosen.model, tmp_path / "quarot", group_size=32)
    quant = json.loads((quantized.model.path / "config.json").read_text())["quantization_config"]
    assert set(quant["overrides"]) == set(chosen.details["chosen"]) - {"lm_head"}  # lm_head: false leaves the head in float
    assert quantized.details["overrides"] == 4


def test_merge_overrides_updates_an_inherited_module_with_the_steps_settings() -> None:
    merged = merge_overrides({"lm_head": {"group_size": 32}}, {"lm_head": {"bits": 8, "symmetric": True}, "a.b": {"bits": 8}})
    assert merged == {"lm_head": {"bits": 8, "sym": True, "group_size": 32}, "a.b": {"bits": 8}}
    assert list(merged) == ["lm_head", "a.b"]


def test_the_chain_into_gptq_builds_8_bit_matmulnbits_on_the_chosen_modules(tmp_path: Path) -> None:
    import onnx

    model, tok = _llama(8)
    chosen = run_pass(SelectiveMixedPrecision, _save(model, tok, tmp_path / "hf"), tmp_path / "smp", algorithm="k_quant_mixed")
    quantized = _run(
        chosen.model, tmp_path / "gptq", tok, Gptq, calibration="calib", samples=4, sequence_length=32, group_size=32, lm_head=True
    )
    (tmp_path / "b" / "work").mkdir(parents=True)
    ctx = PassContext(step_id="build", workdir=tmp_path / "b" / "work", output_dir=tmp_path / "b" / "onnx")
    built = GenaiBuild(GenaiBuild.Config(precision="int4", accuracy_level=1))(quantized.model, ctx)
    proto = onnx.load(str(built.model.path / "model.onnx"), load_external_data=False)
    bits = {n.name: next(a.i for a in n.attribute if a.name == "bits") for n in proto.graph.node if n.op_type == "MatMulNBits"}
    expected = {"/lm_head/MatMulNBits"}
    for i in (0, 3, 6, 7):  # Olive's rule for 8 layers
        expected |= {f"/model/layers.{i}/attn/qkv_proj/MatMulNBits", f"/model/layers.{i}/mlp/down_proj/MatMulNBits"}
    assert {name for name, b in bits.items() if b == 8} == expected
    assert len(bits) == 8 * 5 + 1  # per layer: qkv (fused), o, gate, up, down; and the head


def test_the_mixed_model_errs_between_all_4_bit_and_all_8_bit(tmp_path: Path) -> None:
    model, tok = _sensitive_llama()
    result = run_pass(SelectiveMixedPrecision, _save(model, tok, tmp_path / "hf"), tmp_path, algorithm="snr", ratio=0.7, group_size=32)
    overrides = merge_overrides({}, _info(result)["overrides"])
    ids = torch.tensor([tok(TEXT)["input_ids"][:64]])
    with torch.no_grad():
        reference = model(input_ids=ids).logits

    def error(bits: int, overrides: dict[str, Any]) -> float:
        quantized = copy.deepcopy(model)
        quantize_linear_layers(quantized, "rtn", bits, 32, False, lm_head=True, overrides=overrides)
        with torch.no_grad():
            return float(((quantized(input_ids=ids).logits - reference) ** 2).mean())

    four, mixed, eight = error(4, {}), error(4, overrides), error(8, {})
    assert eight < mixed < four, (eight, mixed, four)
    assert mixed < 0.5 * four
