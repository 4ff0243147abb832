"""static_llm (Olive's StaticLLM) on the tiny genai decoder: the prefill and token-generation
models have no symbolic dim left, share one weights file, and Kiln's static loop over them
(right-padded prompt, fixed cache) generates the dynamic decoder's greedy tokens; a prompt longer
than the fixed prompt length, or a generation longer than the cache, is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from genai_models import NEW_TOKENS, PROMPT, TinyGenai

from engine.core import ModelArtifact, PassContext, PassResult
from engine.core.errors import KilnError
from passes.generate.static_llm import StaticLlm
from targets.onnxruntime import OnnxRuntimeTarget
from targets.onnxruntime.static_decoder import StaticDecoderSession

CONTEXT, CACHE = 16, 64


def make_static(tiny_genai: TinyGenai, tmp_path: Path, **options: object) -> PassResult:
    (tmp_path / "work").mkdir(parents=True)
    ctx = PassContext(step_id="static", workdir=tmp_path / "work", output_dir=tmp_path / "out")
    config = StaticLlm.Config(**{"context_length": CONTEXT, "cache_length": CACHE, **options})  # type: ignore[arg-type]
    return StaticLlm(config)(tiny_genai.fp32, ctx)


def session(model: ModelArtifact) -> StaticDecoderSession:
    opened = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="c", runtime="onnxruntime")).open_session(model)  # type: ignore[arg-type]
    assert isinstance(opened, StaticDecoderSession)
    return opened


def dynamic_tokens(tiny_genai: TinyGenai, prompt: list[int], count: int) -> list[int]:
    opened = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="c", runtime="onnxruntime")).open_session(tiny_genai.fp32)  # type: ignore[arg-type]
    return opened.generate(prompt, count).tokens  # type: ignore[attr-defined]


def test_prefill_and_decode_models_are_static_and_generate_the_dynamic_tokens(tiny_genai: TinyGenai, tmp_path: Path) -> None:
    import onnx
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    from passes.graph.fixed_shape import symbolic_dims

    result = make_static(tiny_genai, tmp_path, update_genai_config=True, group_session_options={"log_id": "static"})
    out = Path(result.model.path)
    assert sorted(path.name for path in out.glob("*.onnx*")) == ["decode.onnx", "model.onnx", "model.onnx.data"]
    for name, length in (("model.onnx", CONTEXT), ("decode.onnx", 1)):
        proto = onnx.load(str(out / name))
        assert symbolic_dims(onnx.shape_inference.infer_shapes(proto)) == {}
        assert symbolic_dims(SymbolicShapeInference.infer_shapes(proto)) == {}
        assert result.details["models"][name] == {"input_ids": [1, length], "attention_mask": [1, CACHE]}
    config = json.loads((out / "genai_config.json").read_text())
    assert config["search"]["max_length"] == config["model"]["context_length"] == CACHE
    assert config["model"]["type"] == "decoder-pipeline"
    (stages,) = config["model"]["decoder"]["pipeline"]
    assert stages["prefill"]["filename"] == "model.onnx" and stages["prefill"]["run_on_token_gen"] is False
    assert stages["decode"]["filename"] == "decode.onnx" and stages["decode"]["run_on_prompt"] is False
    assert stages["decode"]["session_options"] == {"log_id": "static"}
    assert config["model"]["decoder"]["sliding_window"]["window_size"] == CONTEXT

    static = session(result.model)
    assert static.details["static"] == {
        "batch_size": 1,
        "context_length": CONTEXT,
        "cache_length": CACHE,
        "models": ["model.onnx", "decode.onnx"],
    }
    assert static.generate(PROMPT, NEW_TOKENS).tokens == tiny_genai.greedy
    short, full = PROMPT[:3], [*PROMPT, *PROMPT, 3, 9]  # 16 tokens: the whole prefill, no padding
    assert static.generate(short, 20).tokens == dynamic_tokens(tiny_genai, short, 20)
    assert static.generate(full, CACHE - len(full)).tokens == dynamic_tokens(tiny_genai, full, CACHE - len(full))


def test_prompts_and_generations_that_do_not_fit_are_refused(tiny_genai: TinyGenai, tmp_path: Path) -> None:
    static = session(make_static(tiny_genai, tmp_path).model)
    with pytest.raises(KilnError, match="longer than the static decoder's fixed prompt length"):
        static.generate(list(range(1, CONTEXT + 2)), 2)
    with pytest.raises(KilnError, match="longer than the static decoder's cache"):
        static.generate(PROMPT, CACHE)
    config = json.loads((tmp_path / "out" / "genai_config.json").read_text())
    assert "pipeline" not in config["model"]["decoder"]  # update_genai_config is off by default
    assert config["search"]["max_length"] == CACHE


def test_a_single_static_model_runs_every_step_padded(tiny_genai: TinyGenai, tmp_path: Path) -> None:
    result = make_static(tiny_genai, tmp_path, prefill_decode_models=False)
    assert not (Path(result.model.path) / "decode.onnx").exists()
    static = session(result.model)
    assert static.step_length == CONTEXT
    assert static.generate(PROMPT, NEW_TOKENS).tokens == tiny_genai.greedy
    with pytest.raises(KilnError, match="cache"):  # each step needs CONTEXT free positions
        static.generate(PROMPT, CACHE - len(PROMPT))


def test_refuses_a_decoder_it_cannot_make_static(tiny_genai: TinyGenai, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="past_present_share_buffer"):
        (tmp_path / "work").mkdir()
        ctx = PassContext(step_id="static", workdir=tmp_path / "work", output_dir=tmp_path / "out")
        StaticLlm(StaticLlm.Config())(tiny_genai.unshared, ctx)
    with pytest.raises(Exception, match="longer than the model's context"):
        make_static(tiny_genai, tmp_path / "big", cache_length=4096)
