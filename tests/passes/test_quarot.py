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


def tiny_config(family: str, hidden: int = 64, tied: bool = False, **extra: Any) -> Any:
    """A 2-layer config of ``family`` (grouped-query attention: 4 heads, 2 key/value heads)."""
    if family == "phi3":
        extra.setdefault("pad_token_id", 0)
    return getattr(transformers, _CLASSES[family])(
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
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
