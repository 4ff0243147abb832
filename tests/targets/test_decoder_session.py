"""Kiln's own decode loop on the onnxruntime target (genai decoder folders, see conftest): the
bound loop (cache kept in OrtValues, shared past/present buffer or presents fed back as past) and
the naive host loop reproduce PyTorch's greedy continuation; only logits reach the host in the
bound loop."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from genai_models import NEW_TOKENS, PROMPT, TinyGenai

from engine.core.errors import KilnError
from targets.genai import GenaiTarget
from targets.onnxruntime import OnnxRuntimeTarget
from targets.onnxruntime.decoder import DecoderSession

VOCAB = 320
HEAD_SIZE = 32  # the tiny llama: hidden 128, 4 heads


def ort(**options: object) -> OnnxRuntimeTarget:
    return OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="c", runtime="onnxruntime", **options))  # type: ignore[arg-type]


def open_decoder(model, **options: object) -> DecoderSession:  # type: ignore[no-untyped-def]
    session = ort(**options).open_session(model)
    assert isinstance(session, DecoderSession)
    return session


@pytest.mark.parametrize("io_binding", [None, True, False])
@pytest.mark.parametrize("model", ["fp32", "unshared"])
def test_both_loops_reproduce_the_pytorch_greedy_continuation(tiny_genai: TinyGenai, model: str, io_binding: bool | None) -> None:
    session = open_decoder(getattr(tiny_genai, model), io_binding=io_binding)
    generation = session.generate(PROMPT, NEW_TOKENS)
    assert generation.tokens == tiny_genai.greedy
    assert len(generation.decode_s) == NEW_TOKENS - 1
    assert generation.decode_tokens_per_s * sum(generation.decode_s) == pytest.approx(len(generation.decode_s))
    assert session.details["decode_loop"] == ("naive" if io_binding is False else "bound")
    assert session.details["io_binding"] == ("off" if io_binding is False else "host")


def test_the_bound_loop_keeps_the_cache_in_ortvalues_and_copies_only_logits(tiny_genai: TinyGenai) -> None:
    import onnxruntime

    shared = open_decoder(tiny_genai.fp32)
    shared.generate(PROMPT, NEW_TOKENS)
    assert shared.details["kv_cache"] == "shared past/present buffer"
    # prefill: every prompt position's logits; then one position per token (float32)
    logits_only = (len(PROMPT) + NEW_TOKENS - 1) * VOCAB * 4
    assert shared.host_bytes == logits_only
    # one buffer of the full length per layer's key and value, written in place
    assert len(shared.last_cache) == 4
    for value in shared.last_cache.values():
        assert isinstance(value, onnxruntime.OrtValue)
        assert value.shape() == [1, 2, len(PROMPT) + NEW_TOKENS, HEAD_SIZE]

    unshared = open_decoder(tiny_genai.unshared)
    unshared.generate(PROMPT, NEW_TOKENS)
    assert unshared.host_bytes == logits_only
    for value in unshared.last_cache.values():  # the last step's presents, never copied to the host
        assert isinstance(value, onnxruntime.OrtValue)
        assert value.shape() == [1, 2, len(PROMPT) + NEW_TOKENS - 1, HEAD_SIZE]

    naive = open_decoder(tiny_genai.fp32, io_binding=False)
    naive.generate(PROMPT, NEW_TOKENS)
    assert naive.host_bytes > logits_only  # the whole cache, every token


def test_logits_match_pytorch_and_genai(tiny_genai: TinyGenai) -> None:
    logits = open_decoder(tiny_genai.fp32).logits(PROMPT)
    assert logits.shape == (len(PROMPT), VOCAB) and logits.dtype == np.float32
    np.testing.assert_allclose(logits, tiny_genai.torch_logits, atol=1e-4, rtol=1e-4)
    genai = GenaiTarget(GenaiTarget.Config(id="g", runtime="onnxruntime-genai")).open_session(tiny_genai.fp32)
    np.testing.assert_allclose(logits, genai.logits(PROMPT), atol=1e-5, rtol=1e-5)
    # the SDK's plain run: logits per row, zero past each row's tokens
    (batch,) = open_decoder(tiny_genai.fp32).run({"input_ids": np.array([PROMPT]), "attention_mask": np.ones((1, len(PROMPT)), np.int64)})
    np.testing.assert_allclose(batch[0], logits, atol=1e-6)


def test_an_int4_model_generates_as_genai_does(tiny_genai: TinyGenai) -> None:
    tokens = open_decoder(tiny_genai.int4).generate(PROMPT, NEW_TOKENS).tokens
    assert len(tokens) == NEW_TOKENS
    genai = GenaiTarget(GenaiTarget.Config(id="g", runtime="onnxruntime-genai")).open_session(tiny_genai.int4)
    assert tokens == genai.generate(PROMPT, NEW_TOKENS).tokens


def test_generation_longer_than_the_context_is_refused(tiny_genai: TinyGenai) -> None:
    with pytest.raises(KilnError, match="longer than the model's context"):
        open_decoder(tiny_genai.fp32).generate(PROMPT, 1000)


def _cuda() -> bool:
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers() and shutil.which("nvidia-smi") is not None


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs onnxruntime's CUDA provider and an NVIDIA GPU")
def test_on_cuda_the_cache_stays_on_the_gpu(tiny_genai: TinyGenai) -> None:
    session = open_decoder(tiny_genai.fp32, device="cuda")
    assert session.details["io_binding"] == "device"
    assert session.generate(PROMPT, NEW_TOKENS).tokens == tiny_genai.greedy
    assert session.host_bytes == (len(PROMPT) + NEW_TOKENS - 1) * VOCAB * 4
    assert all(value.device_name() == "cuda" for value in session.last_cache.values())


@pytest.mark.parametrize("model", ["fp32", "unshared"])
def test_the_device_path_of_the_bound_loop_reproduces_pytorch_with_the_cache_bound_on_the_cpu(tiny_genai: TinyGenai, model: str) -> None:
    """The loop a GPU runs (inputs and logits as OrtValues, the logits read back after the run),
    with its buffers in CPU memory: the tokens are PyTorch's greedy FP32 ones exactly. The prefill
    read the first bound output as its logits, which is present.0.key (the buffers are bound
    first), so on CUDA every token differed from the first on."""
    import onnxruntime

    session = open_decoder(getattr(tiny_genai, model))
    session.host_arrays = False
    for _ in range(2):  # a second generation reuses the loop's buffers and bindings
        assert session.generate(PROMPT, NEW_TOKENS).tokens == tiny_genai.greedy
    if model == "fp32":
        assert session._loop is not None and session._loop.step_host is None  # the device path, not numpy views
    assert session.host_bytes == (len(PROMPT) + NEW_TOKENS - 1) * VOCAB * 4
    assert all(isinstance(value, onnxruntime.OrtValue) for value in session.last_cache.values())
    shorter = session.generate(PROMPT[:3], 4).tokens
    assert shorter == open_decoder(getattr(tiny_genai, model)).generate(PROMPT[:3], 4).tokens


@pytest.mark.parametrize("host_arrays", [True, False])
def test_the_static_mask_a_cuda_graph_needs_gives_pytorchs_tokens(tiny_genai: TinyGenai, host_arrays: bool) -> None:
    """The decode step with one [1, capacity] mask updated in place (ones so far, zeros after) and
    every other input and output bound once: what a CUDA graph of the step replays. Run on the
    CPU, the tokens are PyTorch's greedy FP32 ones, across reused and shorter generations."""
    session = open_decoder(tiny_genai.fp32)
    session.static_mask, session.host_arrays = True, host_arrays
    for _ in range(2):
        assert session.generate(PROMPT, NEW_TOKENS).tokens == tiny_genai.greedy
    assert session._loop is not None and session._loop.mask is not None  # the static mask was bound
    assert session._loop.mask.shape() == [1, len(PROMPT) + NEW_TOKENS]
    assert session.generate(PROMPT[:3], 4).tokens == open_decoder(tiny_genai.fp32).generate(PROMPT[:3], 4).tokens


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs onnxruntime's CUDA provider and an NVIDIA GPU")
def test_on_cuda_the_decode_step_runs_as_a_cuda_graph(tiny_genai: TinyGenai, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An fp16 CUDA build (the GPU reference) with cuda.enable_cuda_graph: the decode step is
    captured once and replayed; the tokens are those of the same loop without a graph."""
    from engine.core import ModelArtifact, PassContext
    from passes.generate.genai_build import GenaiBuild

    (tmp_path / "work").mkdir()
    ctx = PassContext(step_id="fp16", workdir=tmp_path / "work", output_dir=tmp_path / "fp16")
    built = GenaiBuild(GenaiBuild.Config(precision="fp16", execution_provider="cuda"))(ModelArtifact.from_folder("hf", tiny_genai.hf), ctx)
    plain = open_decoder(built.model, device="cuda")
    graphed = open_decoder(built.model, device="cuda", cuda={"enable_cuda_graph": True})
    assert graphed.graph and graphed.details["cuda_graph"]["decode_step"]
    expected = plain.generate(PROMPT, NEW_TOKENS).tokens
    for _ in range(3):  # capture, then replays
        assert graphed.generate(PROMPT, NEW_TOKENS).tokens == expected


def test_inference_settings_name_the_decode_loop(tiny_genai: TinyGenai) -> None:
    target = ort()
    session = target.open_session(tiny_genai.fp32)
    settings = target.inference_settings(session.details)
    assert settings["decode_loop"] == {"loop": "bound", "kv_cache": "shared past/present buffer"}
    code = target.snippet(settings, str(tiny_genai.fp32.model_file))
    assert "greedy decode loop" in code and "def run(feeds)" not in code
    namespace: dict[str, object] = {}
    exec(compile(code, "snippet", "exec"), namespace)  # opens the model as measured


def test_the_shared_buffer_loop_reused_across_generations_gives_what_a_fresh_session_gives(tiny_genai: TinyGenai) -> None:
    """The bound loop keeps its buffers and bindings between generations (a longer one grows
    them): whatever ran before, each continuation is the one a fresh session gives."""
    session = open_decoder(tiny_genai.fp32)
    short, long = PROMPT[:3], PROMPT + PROMPT[:5]
    asked = [(PROMPT, NEW_TOKENS), (short, 2), (long, NEW_TOKENS + 6), (short, NEW_TOKENS), (PROMPT, NEW_TOKENS)]
    for prompt, count in asked:
        fresh = open_decoder(tiny_genai.fp32).generate(prompt, count).tokens
        assert session.generate(prompt, count).tokens == fresh
    assert session.generate(PROMPT, NEW_TOKENS).tokens == tiny_genai.greedy
    # the buffers grew once, to the longest generation, and were kept
    assert {tuple(v.shape()) for v in session.last_cache.values()} == {(1, 2, len(long) + NEW_TOKENS + 6, HEAD_SIZE)}
