"""QuaRot's rotation (passes/torch_quant/_rotate.py) on tiny random decoders of every supported
family: the rotated model computes the same logits, its norms have scale 1, its lm_head is
untied, an outlier column is spread out, and other layouts are refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from passes.torch_quant._rotate import (  # noqa: E402
    UnsupportedArchitecture,
    orthogonal_matrix,
    rotate_model,
    sylvester_hadamard,
)

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "phi3")
_CLASSES = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config", "mistral": "MistralConfig", "phi3": "Phi3Config"}
VOCAB = 128


def tiny_config(family: str, hidden: int = 64, tied: bool = False, vocab: int = VOCAB, **extra: Any) -> Any:
    """A 2-layer config of ``family`` (grouped-query attention: 4 heads, 2 key/value heads)."""
    if family == "phi3":
        # original = max positions: otherwise the model builder takes it for a LongRoPE Phi-3
        extra.update(pad_token_id=0, original_max_position_embeddings=64)
    return getattr(transformers, _CLASSES[family])(
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=tied,
        **extra,
    )


def tiny_model(family: str, seed: int = 0, **config: Any) -> Any:
    """A random model whose norm scales and biases are not their defaults (1 and 0), so that
    folding them is exercised."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(family, **config)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1 + 0.3 * torch.randn_like(parameter))
            elif name.endswith("bias"):
                parameter.copy_(0.1 * torch.randn_like(parameter))
    return model


def logits(model: Any, ids: Any) -> Any:
    with torch.no_grad():
        return model(ids).logits.double()


def _ids(seed: int = 1) -> Any:
    return torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(seed))


def _assert_same_logits(before: Any, after: Any) -> None:
    scale = before.abs().max().item()
    assert (before - after).abs().max().item() <= 1e-5 * max(scale, 1.0), "rotation changed the logits"


@pytest.mark.parametrize("family", FAMILIES)
def test_rotation_keeps_the_logits(family: str) -> None:
    model, ids = tiny_model(family), _ids()
    before = logits(model, ids)
    report = rotate_model(model, seed=3)
    assert report.model_type == family and report.residual_rotation == "hadamard" and report.head_rotation == "hadamard"
    _assert_same_logits(before, logits(model, ids))


@pytest.mark.parametrize("family", ("llama", "phi3"))
def test_rotation_without_head_rotation_keeps_the_logits(family: str) -> None:
    model, ids = tiny_model(family), _ids()
    before = logits(model, ids)
    report = rotate_model(model, seed=3, rotate_heads=False, rotate_mode="random")
    assert report.head_rotation is None and report.residual_rotation == "random orthogonal"
    _assert_same_logits(before, logits(model, ids))


def test_a_hidden_size_that_is_not_a_power_of_two_gets_a_random_orthogonal_rotation() -> None:
    model, ids = tiny_model("llama", hidden=96), _ids()  # head_dim 24
    before = logits(model, ids)
    report = rotate_model(model)
    assert report.residual_rotation.startswith("random orthogonal") and report.head_rotation.startswith("random orthogonal")
    assert any("96 is not a power of two" in note for note in report.notes)
    _assert_same_logits(before, logits(model, ids))


def test_rotation_changes_the_weights_and_sets_the_norm_scales_to_one() -> None:
    model = tiny_model("qwen3")
    embed = model.model.embed_tokens.weight.detach().clone()
    q_norm = model.model.layers[0].self_attn.q_norm.weight.detach().clone()
    rotate_model(model)
    assert not torch.allclose(model.model.embed_tokens.weight, embed)
    for layer in model.model.layers:
        assert torch.equal(layer.input_layernorm.weight, torch.ones_like(layer.input_layernorm.weight))
        assert torch.equal(layer.post_attention_layernorm.weight, torch.ones_like(layer.post_attention_layernorm.weight))
    assert torch.equal(model.model.norm.weight, torch.ones_like(model.model.norm.weight))
    # the per-head norms act on the head dimension, which R1 does not touch
    assert torch.equal(model.model.layers[0].self_attn.q_norm.weight, q_norm)


def test_a_tied_lm_head_is_untied_and_stays_untied_when_saved(tmp_path: Path) -> None:
    model, ids = tiny_model("qwen3", tied=True), _ids()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    before = logits(model, ids)
    assert rotate_model(model).untied_lm_head
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.tie_word_embeddings is False
    assert loaded.lm_head.weight.data_ptr() != loaded.model.embed_tokens.weight.data_ptr()
    _assert_same_logits(before, logits(loaded, ids))


def test_the_rotation_is_seeded() -> None:
    first, second, other = tiny_model("llama"), tiny_model("llama"), tiny_model("llama")
    rotate_model(first, seed=7)
    rotate_model(second, seed=7)
    rotate_model(other, seed=8)
    assert torch.equal(first.lm_head.weight, second.lm_head.weight)
    assert not torch.equal(first.lm_head.weight, other.lm_head.weight)


def test_the_random_hadamard_matrix_is_orthogonal() -> None:
    h = sylvester_hadamard(8)
    assert torch.equal(h @ h.T, 8 * torch.eye(8, dtype=torch.float64))
    q, kind = orthogonal_matrix(64, "hadamard", torch.Generator().manual_seed(0))
    assert kind == "hadamard" and torch.allclose(q @ q.T, torch.eye(64, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(q.abs(), torch.full_like(q, 1 / 8))


def test_rotation_spreads_an_outlier_column() -> None:
    # activations or weights with one channel 50x the others: the max / RMS ratio that sets a
    # quantizer's step falls by about sqrt(d) once a random Hadamard matrix mixes the channels
    generator = torch.Generator().manual_seed(0)
    matrix = torch.randn(256, 128, generator=generator, dtype=torch.float64)
    matrix[:, 5] *= 50
    q, _ = orthogonal_matrix(128, "hadamard", generator)

    def max_over_rms(x: Any) -> float:
        return float(x.abs().max() / x.pow(2).mean().sqrt())

    rotated = matrix @ q
    assert max_over_rms(matrix) > 20
    assert max_over_rms(rotated) < max_over_rms(matrix) / 5
    # per row (a token, or an output channel of a weight), the outlier no longer dominates
    assert float((rotated.abs().amax(dim=1) / rotated.pow(2).mean(dim=1).sqrt()).max()) < 5


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (
            lambda: transformers.GemmaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16),
            r"gemma.*\(1 \+ weight\)",
        ),
        (lambda: transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4), r"gpt2 \(GPT2LMHeadModel\)|cannot rotate a gpt2"),
    ],
)
def test_other_architectures_are_refused_by_name(config: Any, match: str) -> None:
    model = transformers.AutoModelForCausalLM.from_config(config())
    with pytest.raises(UnsupportedArchitecture, match=match):
        rotate_model(model)


# --- the quarot pass: rotation, then the shared quantizer and checkpoint writer ---


def _with_outlier_columns(model: Any, channels: tuple[int, ...] = (3, 70), factor: float = 20.0) -> Any:
    """Input channels 20x larger in every linear reading the residual stream (q/k/v, gate/up),
    the weight outliers that make a group's quantization step coarse for all its other weights."""
    with torch.no_grad():
        for layer in model.model.layers:
            for linear in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.mlp.gate_proj, layer.mlp.up_proj):
                linear.weight[:, list(channels)] *= factor
    return model


def _row_max_over_rms(model: Any) -> float:
    """The mean over the rows of every q/k/v and gate/up weight of max |w| / RMS(w) (what sets an
    asymmetric per-row grid's step against the typical weight)."""
    ratios = []
    for layer in model.model.layers:
        for linear in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.mlp.gate_proj, layer.mlp.up_proj):
            weight = linear.weight.detach().double()
            ratios.append(weight.abs().amax(dim=1) / weight.pow(2).mean(dim=1).sqrt())
    return float(torch.cat(ratios).mean())


def test_rotated_weights_are_more_incoherent_only_where_there_were_outliers() -> None:
    # the rotation computes the same function and its weights' max / RMS per row falls from the
    # outliers' level to a Gaussian row's; weights already Gaussian-like (no outlier) keep that level
    outliers = _with_outlier_columns(tiny_model("llama", hidden=128))
    ids = _ids()
    before, ratio = logits(outliers, ids), _row_max_over_rms(outliers)
    rotate_model(outliers, seed=0)
    _assert_same_logits(before, logits(outliers, ids))
    assert ratio > 6 and _row_max_over_rms(outliers) < ratio / 2
    gaussian = tiny_model("llama", hidden=128)
    with torch.no_grad():
        for name, parameter in gaussian.named_parameters():
            if "norm" in name:
                parameter.fill_(1.0)
    ratio = _row_max_over_rms(gaussian)
    rotate_model(gaussian, seed=0)
    assert abs(_row_max_over_rms(gaussian) - ratio) < 0.1 * ratio


@pytest.mark.parametrize("group_size", (32, 128))
def test_quarot_and_rtn_lose_less_than_rtn_alone_on_a_model_with_outliers(group_size: int) -> None:
    import copy

    from passes.torch_quant._quantize import quantize_linear_layers

    base = _with_outlier_columns(tiny_model("llama", hidden=128))
    ids = torch.randint(0, VOCAB, (4, 32), generator=torch.Generator().manual_seed(0))
    reference = logits(base, ids)

    def relative_error(model: Any) -> float:
        return float(((logits(model, ids) - reference) ** 2).mean() / (reference**2).mean())

    plain = copy.deepcopy(base)
    quantize_linear_layers(plain, "rtn", 4, group_size, False)
    rotated = copy.deepcopy(base)
    rotate_model(rotated, seed=0)
    quantize_linear_layers(rotated, "rtn", 4, group_size, False)
    # measured: 0.074 -> 0.037 (group 32), 0.26 -> 0.070 (group 128)
    assert relative_error(rotated) < relative_error(plain) / 1.5


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from decoders import tiny_decoder

    from engine.core import ModelArtifact

    return ModelArtifact.from_folder("hf", tiny_decoder(tmp_path_factory.mktemp("quarot") / "hf", "llama", hidden=128))


def test_quarot_rtn_checkpoint_builds_an_int4_decoder_that_generates(tiny_llama: Any, tmp_path: Path) -> None:
    import json

    from decoder_passes import NEW_TOKENS, PROMPT, og_greedy, run_pass

    from passes.generate.genai_build import GenaiBuild
    from passes.torch_quant.quarot import QuaRot

    rotated = run_pass(QuaRot, tiny_llama, tmp_path / "quarot", method="rtn", bits=4, group_size=32)
    assert rotated.model.format == "hf"
    quantization = json.loads((rotated.model.path / "config.json").read_text())["quantization_config"]
    assert quantization["quant_method"] == "olive" and quantization["bits"] == 4 and quantization["group_size"] == 32
    assert quantization["rotation"]["residual_rotation"] == "hadamard" and quantization["rotation"]["head_rotation"] == "hadamard"
    assert rotated.details["quantized_modules"] == 14  # 7 linears in each of 2 layers; lm_head stays float
    built = run_pass(GenaiBuild, rotated.model, tmp_path / "build", precision="int4", block_size=32)
    assert built.details["ops"]["MatMulNBits"] == 11  # 5 a layer (q/k/v fused) and lm_head, which the builder quantizes itself
    assert len(og_greedy(built.model.path, PROMPT, NEW_TOKENS, ignore_eos=True)) == NEW_TOKENS


def test_quarot_gptq_calibrates_on_token_rows(tiny_llama: Any, tmp_path: Path) -> None:
    import numpy as np

    from engine.core import PassContext
    from engine.core.data import Dataset
    from passes.torch_quant.quarot import QuaRot

    ids = np.random.default_rng(0).integers(1, VOCAB, size=(4, 16))
    mask = np.ones_like(ids)
    mask[0, 10:] = 0  # a padded row: its padding is dropped (58 tokens, one window)
    rows = Dataset(inputs={"input_ids": ids, "attention_mask": mask})
    (tmp_path / "work").mkdir()
    ctx = PassContext(
        step_id="quarot", workdir=tmp_path / "work", output_dir=tmp_path / "out", datasets={"calib": lambda signature=None: rows}
    )
    config = QuaRot.Config(method="gptq", calibration="calib", group_size=32, sym=True, sequence_length=64)
    result = QuaRot(config)(tiny_llama, ctx)
    assert result.details["method"] == "gptq" and result.details["calibration"] == {"windows": 1, "tokens": 58}


def test_gptq_without_calibration_is_refused() -> None:
    from pydantic import ValidationError

    from passes.torch_quant.quarot import QuaRot

    with pytest.raises(ValidationError, match="method gptq needs calibration"):
        QuaRot.Config(method="gptq")


def test_the_pass_refuses_an_unsupported_architecture_by_name(tmp_path: Path) -> None:
    from decoder_passes import run_pass
    from decoders import tiny_decoder

    from engine.core import ModelArtifact, PassError
    from passes.torch_quant.quarot import QuaRot

    gpt2 = ModelArtifact.from_folder("hf", tiny_decoder(tmp_path / "gpt2", "gpt2"))
    with pytest.raises(PassError, match="quarot cannot rotate a gpt2"):
        run_pass(QuaRot, gpt2, tmp_path / "run")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_int4_build_computes_what_the_rotated_quantized_model_computes(family: str, tmp_path: Path) -> None:
    # the builder keeps the checkpoint's codes (MatMulNBits, fp32 compute: accuracy_level 1) and
    # its graph (norms with scale 1, untied lm_head) is the rotated model's: logits agree to rounding
    import numpy as np
    import onnxruntime_genai as og
    from decoder_passes import PROMPT, run_pass
    from decoders import tokenizer

    from engine.core import ModelArtifact
    from passes.generate.genai_build import GenaiBuild
    from passes.torch_quant._quantize import quantize_linear_layers
    from passes.torch_quant.quarot import QuaRot

    tok = tokenizer()
    model = tiny_model(family, hidden=128, vocab=len(tok))
    model.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    rotated = run_pass(QuaRot, ModelArtifact.from_folder("hf", tmp_path / "hf"), tmp_path / "quarot", group_size=32, lm_head=True)
    built = run_pass(GenaiBuild, rotated.model, tmp_path / "build", precision="int4", block_size=32, accuracy_level=1)
    rotate_model(model)
    quantize_linear_layers(model, "rtn", 4, 32, False, lm_head=True)
    expected = logits(model, torch.tensor([PROMPT]))[0].numpy()
    generator_model = og.Model(str(built.model.path))
    params = og.GeneratorParams(generator_model)
    params.set_search_options(max_length=len(PROMPT) + 4)
    generator = og.Generator(generator_model, params)
    generator.append_tokens(PROMPT)
    got = np.asarray(generator.get_output("logits")).reshape(-1, expected.shape[-1])
    assert built.details["ops"]["MatMulNBits"] == 11
    np.testing.assert_allclose(got, expected, atol=1e-5 * max(1.0, float(np.abs(expected).max())))


def test_method_none_writes_the_rotated_float_checkpoint_for_a_following_quantizer(tiny_llama: Any, tmp_path: Path) -> None:
    from decoder_passes import PROMPT, run_pass

    from passes.torch_quant.quarot import QuaRot
    from passes.torch_quant.rtn import Rtn

    rotated = run_pass(QuaRot, tiny_llama, tmp_path / "quarot", method="none")
    assert rotated.details["method"] == "none" and "quantization_config" not in (rotated.model.path / "config.json").read_text()
    ids = torch.tensor([PROMPT])
    original = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama.path).eval()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(rotated.model.path).eval()
    assert not torch.equal(loaded.model.embed_tokens.weight, original.model.embed_tokens.weight)
    _assert_same_logits(logits(original, ids), logits(loaded, ids))
    assert run_pass(Rtn, rotated.model, tmp_path / "rtn", group_size=32).details["quantized_modules"] == 14


def test_a_torch_factory_input_is_rotated_and_quantized(tmp_path: Path) -> None:
    import json

    from decoder_passes import run_pass

    from engine.core import ModelArtifact
    from passes.torch_quant.quarot import QuaRot

    factory = (
        "import torch\n"
        "from transformers import AutoModelForCausalLM\n"
        "from decoders import config, tokenizer\n\n\n"
        "def make():\n"
        "    tok = tokenizer()\n"
        "    torch.manual_seed(0)\n"
        "    return AutoModelForCausalLM.from_config(config('llama', len(tok), hidden=64)).eval(), tok\n"
    )
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.py").write_text(factory)
    (tmp_path / "model" / "factory.json").write_text(json.dumps({"file": "model.py", "function": "make"}))
    result = run_pass(QuaRot, ModelArtifact.from_folder("torch", tmp_path / "model"), tmp_path / "run", group_size=32)
    assert result.model.format == "hf" and result.details["quantized_modules"] == 14
    assert any("saved make()'s model and tokenizer" in note for note in result.notes)
