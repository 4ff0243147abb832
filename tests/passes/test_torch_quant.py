"""rtn and gptq (passes/torch_quant): the grid and packing by hand, GPTQ against RTN on one layer,
and tiny random decoders of eight families quantized in PyTorch, built by genai_build at int4 and
generating exactly the tokens of the fake-quantized PyTorch model with ONNX Runtime GenAI."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from decoder_passes import run_pass
from decoders import tokenizer

from engine.core import ModelArtifact, PassContext, PassError, PassResult
from engine.core.data import Dataset
from passes.generate.genai_build import GenaiBuild
from passes.torch_quant._gptq import HessianAccumulator, gptq_quantize_weight
from passes.torch_quant._grid import QuantSpec, dequantize, find_qparams, pack, quantize, unpack
from passes.torch_quant._quantize import quantize_linear_layers, rtn_quantize_weight, write_checkpoint
from passes.torch_quant.gptq import Gptq
from passes.torch_quant.rtn import Rtn

PROMPT = [5, 17, 33, 80, 12, 7, 41]
NEW_TOKENS = 10
#: family -> (transformers config class, options beyond the common ones)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    # the builder takes Phi-3 for LongRoPE when the two lengths differ
    "phi3": ("Phi3Config", {"original_max_position_embeddings": 256}),
    "mistral": ("MistralConfig", {}),
    "gemma2": ("Gemma2Config", {"head_dim": 16, "sliding_window": 128, "tie_word_embeddings": True}),
    "gemma3_text": ("Gemma3TextConfig", {"head_dim": 16, "sliding_window": 128, "tie_word_embeddings": True}),
    "smollm3": ("SmolLM3Config", {}),
}
#: families the model builder cannot build, even unquantized, with its reason
_SEEDED = threading.Lock()
BUILDER_REFUSES: dict[str, str] = {}  # Gemma 3's per-layer-type rope parameters are handed over as the builder reads them


def test_rtn_of_a_known_matrix_is_the_hand_computed_grid() -> None:
    weight = torch.tensor([[-1.0, 0.0, 0.5, 2.0]])
    codes, scales, zeros = rtn_quantize_weight(weight, QuantSpec(bits=4, group_size=4, sym=False))
    # range [-1, 2] over 15 steps: scale 0.2, zero round(1 / 0.2) = 5; 0.5 / 0.2 + 5 = 7.5 rounds to even 8
    assert torch.allclose(scales, torch.tensor([[0.2]])) and zeros.tolist() == [[5]]
    assert codes.tolist() == [[0, 5, 8, 15]]
    assert torch.allclose(dequantize(codes, scales, zeros, QuantSpec(4, 4, False)), torch.tensor([[-1.0, 0.0, 0.6, 2.0]]))
    codes, scales, zeros = rtn_quantize_weight(weight, QuantSpec(bits=4, group_size=4, sym=True))
    # symmetric: scale 2 * 2 / 15, zero 8; 2.0 -> 15.5 clamps to 15
    assert torch.allclose(scales, torch.tensor([[4 / 15]])) and zeros.tolist() == [[8]]
    assert codes.tolist() == [[4, 8, 10, 15]]


def test_groups_have_their_own_grid() -> None:
    weight = torch.tensor([[0.0, 1.5, 0.0, 15.0]])
    scales, zeros = find_qparams(weight, QuantSpec(bits=4, group_size=2, sym=False))
    assert torch.allclose(scales, torch.tensor([[0.1, 1.0]])) and zeros.tolist() == [[0, 0]]


@pytest.mark.parametrize(("bits", "count"), [(4, 64), (4, 7), (8, 5)])
def test_unpack_inverts_pack(bits: int, count: int) -> None:
    codes = torch.randint(0, 1 << bits, (3, count), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    packed = pack(codes, bits)
    assert packed.dtype == torch.uint8 and packed.shape == (3, (count * bits + 7) // 8)
    assert torch.equal(unpack(packed, bits, count), codes)


def test_packing_puts_the_first_code_in_the_low_bits() -> None:
    assert pack(torch.tensor([[1, 2, 15, 0]]), 4).tolist() == [[0x21, 0x0F]]


def test_gptq_beats_rtn_on_a_layer_with_correlated_inputs() -> None:
    gen = torch.Generator().manual_seed(0)
    mixing = torch.randn(16, 128, generator=gen)
    inputs = torch.randn(2048, 16, generator=gen) @ mixing + 0.05 * torch.randn(2048, 128, generator=gen)
    weight = torch.randn(64, 128, generator=gen)
    spec = QuantSpec(bits=4, group_size=32, sym=False)
    accumulator = HessianAccumulator(128)
    accumulator.add(inputs)
    gptq = dequantize(*gptq_quantize_weight(weight, accumulator.hessian, spec), spec)
    rtn = dequantize(*rtn_quantize_weight(weight, spec), spec)
    reference = inputs @ weight.T
    gptq_mse = float(((inputs @ gptq.T - reference) ** 2).mean())
    rtn_mse = float(((inputs @ rtn.T - reference) ** 2).mean())
    assert gptq_mse < 0.5 * rtn_mse, (gptq_mse, rtn_mse)
    # act order with groups keeps every weight on the grid of its own (contiguous) group
    codes, scales, zeros = gptq_quantize_weight(weight, accumulator.hessian, spec, desc_act=True)
    assert torch.equal(codes, quantize(dequantize(codes, scales, zeros, spec), scales, zeros, spec))


def _decoder(family: str, seed: int = 0, layers: int = 2, **more: Any) -> tuple[torch.nn.Module, Any]:
    """A random 2-layer (or ``layers``) decoder of ``family``, hidden 64, untied head, and the test tokenizer."""
    import transformers

    tok = tokenizer()
    cls, extra = FAMILIES[family]
    config = getattr(transformers, cls)(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        **{"intermediate_size": 128, "tie_word_embeddings": False, **extra, **more},
    )
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config).eval(), tok


def _torch_greedy(model: torch.nn.Module) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return [int(t) for t in out[0, len(PROMPT) :]]


def _og_greedy(folder: Path) -> list[int]:
    """ONNX Runtime GenAI's greedy tokens (a cache of 256: Gemma's sliding window needs 128 at least)."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=256, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(PROMPT)
    out: list[int] = []
    while len(out) < NEW_TOKENS:
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out


def _build(folder: Path, root: Path) -> PassResult:
    (root / "work").mkdir(parents=True)
    ctx = PassContext(step_id="build", workdir=root / "work", output_dir=root / "onnx")
    # accuracy level 1: float32 activations, as the PyTorch model computes
    return GenaiBuild(GenaiBuild.Config(precision="int4", accuracy_level=1))(ModelArtifact.from_folder("hf", folder), ctx)


def _quantize_and_build(family: str, root: Path) -> tuple[list[int], PassResult | PassError, dict[str, Any]]:
    with _SEEDED:  # torch.manual_seed is process-wide: one family's weights at a time, the same every run
        model, tok = _decoder(family)
    batches = [torch.randint(0, len(tok), (1, 48), generator=torch.Generator().manual_seed(i)) for i in range(4)]
    quantized = quantize_linear_layers(model, "gptq", 4, 32, False, lm_head=True, calibration_batches=batches)
    write_checkpoint(model, tok, root / "hf", quantized, bits=4, group_size=32, sym=False, lm_head=True)
    try:
        built: PassResult | PassError = _build(root / "hf", root)
    except PassError as error:
        built = error
    return _torch_greedy(model), built, quantized


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[int], PassResult | PassError, dict[str, Any]]]:
    """Every family quantized with GPTQ (4 bits, groups of 32, lm_head too) and built at int4."""
    import transformers

    root = tmp_path_factory.mktemp("torch_quant")
    for cls, _ in FAMILIES.values():  # transformers' lazy imports are not safe across threads
        getattr(transformers, cls)
    for family in FAMILIES:
        _decoder(family)
    with ThreadPoolExecutor(max_workers=4) as pool:  # the builder runs in subprocesses
        futures = {family: pool.submit(_quantize_and_build, family, root / family) for family in FAMILIES}
        return {family: future.result() for family, future in futures.items()}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gptq_checkpoint_builds_to_int4_and_generates_like_the_fake_quantized_model(family: str, builds: dict[str, Any]) -> None:
    reference, built, _ = builds[family]
    if family in BUILDER_REFUSES:
        assert isinstance(built, PassError) and "rope_type" in str(built)
        pytest.skip(BUILDER_REFUSES[family])
    assert isinstance(built, PassResult), built
    # all 7 linears of a layer (the builder fuses q/k/v and gate/up: 4 MatMuls) and the head
    assert built.details["ops"]["MatMulNBits"] == 2 * 5 + 1 and "MatMul" not in built.details["ops"]
    assert _og_greedy(built.model.path) == reference


def test_the_built_model_carries_the_checkpoint_codes(builds: dict[str, Any]) -> None:
    import onnx
    from onnx import numpy_helper

    _, built, quantized = builds["llama"]
    proto = onnx.load(str(built.model.path / "model.onnx"))
    weights = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    item = quantized["model.layers.1.mlp.down_proj"]
    qweight = weights["model.layers.1.mlp.down_proj.MatMulNBits.qweight"]  # (out, blocks, block bytes)
    assert np.array_equal(qweight.reshape(qweight.shape[0], -1), pack(item.codes, 4).numpy())
    scales = weights["model.layers.1.mlp.down_proj.MatMulNBits.scales"]
    assert np.allclose(scales.reshape(item.scales.shape), item.scales.numpy())


def _calibration_dataset(tok: Any) -> Dataset:
    from decoders import TEXT

    rows = [tok(line)["input_ids"][:32] for line in TEXT.splitlines() if line.strip()]
    width = max(len(r) for r in rows)
    ids = np.array([r + [0] * (width - len(r)) for r in rows], dtype=np.int64)
    mask = np.array([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=np.int64)
    return Dataset(inputs={"input_ids": ids, "attention_mask": mask})


def test_gptq_pass_writes_mixed_precision_that_the_builder_keeps(tmp_path: Path) -> None:
    import onnx

    model, tok = _decoder("llama")
    model.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    (tmp_path / "work").mkdir()
    ctx = PassContext(
        step_id="gptq", workdir=tmp_path / "work", output_dir=tmp_path / "q", datasets={"calib": lambda: _calibration_dataset(tok)}
    )
    config = Gptq.Config(calibration="calib", samples=8, sequence_length=64, group_size=32, overrides={"re:.*down_proj": {"bits": 8}})
    result = Gptq(config)(ModelArtifact.from_folder("hf", tmp_path / "hf"), ctx)
    assert result.model.format == "hf" and result.details["modules_by_bits"] == {"int4": 12, "int8": 2}
    assert result.details["calibration"]["windows"] >= 2
    quant = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    assert quant["quant_method"] == "olive" and quant["bits"] == 4 and quant["group_size"] == 32
    assert quant["overrides"] == {f"model.layers.{i}.mlp.down_proj": {"bits": 8, "group_size": 32, "symmetric": False} for i in (0, 1)}
    built = _build(tmp_path / "q", tmp_path / "b")
    proto = onnx.load(str(built.model.path / "model.onnx"), load_external_data=False)
    bits = {n.name: next(a.i for a in n.attribute if a.name == "bits") for n in proto.graph.node if n.op_type == "MatMulNBits"}
    assert {name for name, b in bits.items() if b == 8} == {f"/model/layers.{i}/mlp/down_proj/MatMulNBits" for i in (0, 1)}


def test_rtn_pass_leaves_lm_head_in_float_by_default(tmp_path: Path) -> None:
    from safetensors import safe_open

    model, tok = _decoder("qwen2")
    model.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    result = run_pass(Rtn, ModelArtifact.from_folder("hf", tmp_path / "hf"), tmp_path, group_size=32, sym=True)
    with safe_open(str(result.model.path / "model.safetensors"), "pt") as handle:
        names = set(handle.keys())
    assert "lm_head.weight" in names and "model.layers.0.self_attn.q_proj.qweight" in names
    assert "model.layers.0.self_attn.q_proj.qzeros" not in names  # symmetric: MatMulNBits' default zero point
    assert "model.layers.0.self_attn.q_proj.bias" in names  # Qwen2's q/k/v biases are kept
    assert result.details["quantized_modules"] == 14


def test_a_group_size_that_does_not_divide_is_refused() -> None:
    model, _ = _decoder("llama")
    with pytest.raises(ValueError, match="group_size 256 does not divide the 64 input features"):
        quantize_linear_layers(model, "rtn", 4, 256)


def test_a_per_row_checkpoint_whose_rows_make_no_matmulnbits_block_is_refused_by_the_build(tmp_path: Path) -> None:
    """group_size -1 on rows of 96 inputs: the builder writes block_size 96, which ONNX Runtime cannot open."""
    model, tok = _decoder("llama", intermediate_size=96)
    quantized = quantize_linear_layers(model, "rtn", 4, -1, False)
    write_checkpoint(model, tok, tmp_path / "hf", quantized, bits=4, group_size=-1, sym=False, lm_head=False)
    with pytest.raises(PassError, match=r"block_size 96 in 2 node\(s\).*block sizes 16, 32, 64, 128, 256.*group_size 32, 64 or 128"):
        _build(tmp_path / "hf", tmp_path)


def test_an_override_pattern_that_is_no_regex_is_refused() -> None:
    with pytest.raises(ValueError, match="is not a regular expression"):
        Rtn.Config(overrides={"re:(": {"bits": 8}})


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _float_folder(family: str, folder: Path) -> Path:
    model, tok = _decoder(family)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_rtn_after_gptq_keeps_gptq_codes_and_quantizes_lm_head_from_its_float_weights(tmp_path: Path) -> None:
    import onnx

    from passes.torch_quant._input import load_input

    hf = _float_folder("llama", tmp_path / "hf")
    (tmp_path / "work").mkdir()
    ctx = PassContext(
        step_id="gptq", workdir=tmp_path / "work", output_dir=tmp_path / "g", datasets={"calib": lambda: _calibration_dataset(tokenizer())}
    )
    gptq = Gptq(Gptq.Config(calibration="calib", samples=8, sequence_length=64, group_size=32))(ModelArtifact.from_folder("hf", hf), ctx)
    result = run_pass(Rtn, gptq.model, tmp_path / "r", bits=8, lm_head=True, group_size=32)
    assert result.details["kept_quantized_modules"] == 14 and result.details["modules_by_bits"] == {"int8": 1}
    before, after = _tensors(tmp_path / "g"), _tensors(result.model.path)
    assert set(after) == set(before) - {"lm_head.weight"} | {"lm_head.qweight", "lm_head.scales", "lm_head.qzeros"}
    assert all(after[k].dtype == before[k].dtype and torch.equal(after[k], before[k]) for k in before if k in after)
    codes, _, _ = rtn_quantize_weight(before["lm_head.weight"], QuantSpec(8, 32, False))  # gptq left the head in float
    assert torch.equal(after["lm_head.qweight"], pack(codes, 8))
    quant = json.loads((result.model.path / "config.json").read_text())["quantization_config"]
    assert quant["bits"] == 4 and quant["group_size"] == 32 and quant["lm_head"] is True
    assert quant["overrides"] == {"lm_head": {"bits": 8, "group_size": 32, "symmetric": False}}
    built = _build(result.model.path, tmp_path / "b")
    proto = onnx.load(str(built.model.path / "model.onnx"), load_external_data=False)
    bits = {n.name: next(a.i for a in n.attribute if a.name == "bits") for n in proto.graph.node if n.op_type == "MatMulNBits"}
    assert {name for name, b in bits.items() if b == 8} == {"/lm_head/MatMulNBits"} and len(bits) == 2 * 5 + 1
    fake_quantized = load_input(result.model.path, "test", allow_quantized=True).model  # every weight its dequantized codes
    assert _og_greedy(built.model.path) == _torch_greedy(fake_quantized)


@pytest.mark.parametrize("family", ["phi3", "gemma2"])
def test_rtn_of_an_rtn_checkpoint_keeps_fused_and_tied_modules_bit_for_bit(family: str, tmp_path: Path) -> None:
    hf = _float_folder(family, tmp_path / "hf")
    first = run_pass(Rtn, ModelArtifact.from_folder("hf", hf), tmp_path / "one", group_size=32)
    second = run_pass(Rtn, first.model, tmp_path / "two", bits=8, group_size=32, lm_head=True)
    before, after = _tensors(first.model.path), _tensors(second.model.path)
    assert "lm_head.qweight" in after and after["lm_head.qweight"].shape[1] == 64  # 8 bits: one code a byte
    packed = [k for k in before if k.endswith((".qweight", ".scales", ".qzeros"))]
    assert len(packed) >= 2 * 7 * 2 and all(torch.equal(after[k], before[k]) for k in packed)


def test_gptq_of_an_rtn_checkpoint_calibrates_through_its_codes_and_keeps_them(tmp_path: Path) -> None:
    hf = _float_folder("qwen2", tmp_path / "hf")
    first = run_pass(Rtn, ModelArtifact.from_folder("hf", hf), tmp_path / "one", group_size=32, sym=True)
    (tmp_path / "work").mkdir()
    ctx = PassContext(
        step_id="gptq", workdir=tmp_path / "work", output_dir=tmp_path / "g", datasets={"calib": lambda: _calibration_dataset(tokenizer())}
    )
    second = Gptq(Gptq.Config(calibration="calib", samples=2, sequence_length=32, group_size=32, lm_head=True))(first.model, ctx)
    before, after = _tensors(first.model.path), _tensors(second.model.path)
    assert second.details["kept_quantized_modules"] == 14 and second.details["modules_by_bits"] == {"int4": 1}
    assert all(torch.equal(after[k], before[k]) for k in before if k != "lm_head.weight")  # q/k/v biases too
    quant = json.loads((second.model.path / "config.json").read_text())["quantization_config"]
    assert quant["symmetric"] is True and quant["overrides"] == {"lm_head": {"bits": 4, "group_size": 32, "symmetric": False}}


def test_an_input_missing_weights_is_refused_by_name(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    hf = _float_folder("llama", tmp_path / "hf")
    state = _tensors(hf)
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(hf / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(PassError, match=r"lacks 1 weight.*model\.layers\.1\.mlp\.up_proj\.weight"):
        run_pass(Rtn, ModelArtifact.from_folder("hf", hf), tmp_path)


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_an_input_quantized_by_another_method_is_refused(method: str, tmp_path: Path) -> None:
    hf = _float_folder("llama", tmp_path / "hf")
    config = json.loads((hf / "config.json").read_text())
    config["quantization_config"] = {"quant_method": method, "bits": 4, "group_size": 128}
    (hf / "config.json").write_text(json.dumps(config))
    with pytest.raises(PassError, match=f"quant_method '{method}'"):
        run_pass(Rtn, ModelArtifact.from_folder("hf", hf), tmp_path)


def test_quarot_and_selective_mixed_precision_refuse_a_quantized_input(tmp_path: Path) -> None:
    from passes.torch_quant.quarot import QuaRot
    from passes.torch_quant.selective_mixed_precision import SelectiveMixedPrecision

    quantized = run_pass(Rtn, ModelArtifact.from_folder("hf", _float_folder("llama", tmp_path / "hf")), tmp_path / "q", group_size=32)
    with pytest.raises(PassError, match=r"quarot needs a float model.*would not keep their codes"):
        run_pass(QuaRot, quantized.model, tmp_path / "quarot", group_size=32)
    with pytest.raises(PassError, match="selective_mixed_precision needs a float model"):
        run_pass(SelectiveMixedPrecision, quantized.model, tmp_path / "smp", algorithm="k_quant_last")


def test_a_tied_head_is_untied_before_it_is_quantized_and_the_embedding_stays_float() -> None:
    model, _ = _decoder("llama")
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as Gemma and small Qwens are
    model.config.tie_word_embeddings = True
    before = model.model.embed_tokens.weight.detach().clone()
    quantized = quantize_linear_layers(model, "rtn", 4, 32, False, lm_head=True)
    assert "lm_head" in quantized
    assert torch.equal(model.model.embed_tokens.weight, before)  # float, untouched
    assert not torch.equal(model.lm_head.weight, before)  # the head holds its fake-quantized copy
    assert torch.equal(model.lm_head.weight, quantized["lm_head"].dequantized().to(model.lm_head.weight.dtype))


# --- GPTQ against RTN layer by layer on a decoder's own activations ---


def _linear_hessians(model: torch.nn.Module, batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Hessian of every decoder-layer Linear's inputs over ``batches`` (float model)."""
    linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in name}
    found = {name: HessianAccumulator(m.in_features) for name, m in linears.items()}
    hooks = [m.register_forward_hook(lambda _m, i, _o, acc=found[name]: acc.add(i[0])) for name, m in linears.items()]
    with torch.no_grad():
        for batch in batches:
            model(input_ids=batch)
    for hook in hooks:
        hook.remove()
    return {name: acc.hessian for name, acc in found.items()}


def _output_error(weight: torch.Tensor, approximation: torch.Tensor, hessian: torch.Tensor) -> float:
    """``||W X - Q X||²`` over the inputs whose Hessian is ``hessian`` (up to its 2/N factor)."""
    delta = (weight - approximation).double()
    return float(torch.trace(delta @ hessian.double() @ delta.T))


@pytest.mark.parametrize("group_size", (32, -1))
def test_gptq_reconstructs_every_decoder_linear_better_than_rtn_on_the_same_grid(group_size: int) -> None:
    # what GPTQ minimizes, per Linear, on the calibration activations of a decoder: clearly below
    # RTN's with the same per-group min/max grid; act order no worse on the whole
    model, _ = _decoder("llama")
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 200, (1, 64), generator=gen) for _ in range(16)]
    spec = QuantSpec(bits=4, group_size=group_size, sym=False)
    totals = {"rtn": 0.0, "gptq": 0.0, "act": 0.0}
    for name, hessian in _linear_hessians(model, batches).items():
        weight = dict(model.named_modules())[name].weight.detach().float()
        errors = {
            "rtn": _output_error(weight, dequantize(*rtn_quantize_weight(weight, spec), spec), hessian),
            "gptq": _output_error(weight, dequantize(*gptq_quantize_weight(weight, hessian, spec), spec), hessian),
            "act": _output_error(weight, dequantize(*gptq_quantize_weight(weight, hessian, spec, desc_act=True), spec), hessian),
        }
        assert errors["gptq"] < 0.9 * errors["rtn"], (name, errors)
        totals = {key: totals[key] + errors[key] for key in totals}
    assert totals["gptq"] < 0.85 * totals["rtn"], totals
    assert totals["act"] <= 1.02 * totals["gptq"], totals


def test_gptq_with_the_hessian_of_one_input_leaves_rtn_on_the_other_columns_untouched() -> None:
    # a Hessian with one nonzero diagonal entry: the other inputs are dead (zeroed), and the live
    # column is rounded to the same grid RTN would use for it when it is alone in its group
    weight = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    hessian = torch.zeros(4, 4)
    hessian[2, 2] = 1.0
    spec = QuantSpec(bits=4, group_size=1, sym=False)
    codes, scales, zeros = gptq_quantize_weight(weight, hessian, spec)
    rtn = rtn_quantize_weight(weight[:, 2:3], QuantSpec(4, 1, False))
    assert torch.equal(codes[:, 2:3], rtn[0]) and torch.allclose(scales[:, 2:3], rtn[1])
    assert torch.equal(dequantize(codes, scales, zeros, spec)[:, [0, 1, 3]], torch.zeros(8, 3))


def test_layerwise_gptq_quantizes_a_layer_in_stages_of_the_modules_that_read_the_same_input() -> None:
    from functools import partial

    from passes.torch_quant._layerwise import _record, _run_layer, _stages

    model, _ = _decoder("llama", layers=1)
    layer = model.model.layers[0]
    calls, hidden = _record(model, model.model.layers, [torch.tensor([PROMPT])])
    own = {f"model.layers.0.{name}": m for name, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}
    stages = _stages(own, partial(_run_layer, layer, calls[0], hidden))
    short = [[name.rsplit(".", 1)[-1] for name in stage] for stage in stages]
    assert short == [["q_proj", "k_proj", "v_proj"], ["o_proj"], ["gate_proj", "up_proj"], ["down_proj"]]
