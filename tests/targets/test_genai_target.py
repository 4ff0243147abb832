"""The onnxruntime-genai target on tiny decoders exported by the GenAI model builder (see conftest):
greedy generation token for token as PyTorch, logits, int4, settings and snippet, and why a CUDA
target cannot run where there is none."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from genai_models import NEW_TOKENS, PROMPT, TinyGenai

from engine.core.artifact import ModelArtifact
from engine.core.errors import KilnError, TargetUnavailable
from engine.registry import load
from targets.genai import GenaiTarget
from targets.onnxruntime import OnnxRuntimeTarget


def genai(**options: object) -> GenaiTarget:
    return GenaiTarget(GenaiTarget.Config(id="g", runtime="onnxruntime-genai", **options))  # type: ignore[arg-type]


def test_the_target_is_registered_under_its_runtime_name() -> None:
    assert load("targets", "onnxruntime-genai") is GenaiTarget
    assert GenaiTarget.accepts == ("genai",)


def test_greedy_generation_reproduces_pytorch_and_its_timings_add_up(tiny_genai: TinyGenai) -> None:
    session = genai(intra_op_threads=1).open_session(tiny_genai.fp32)
    generation = session.generate(PROMPT, NEW_TOKENS)
    assert generation.tokens == tiny_genai.greedy
    assert len(generation.decode_s) == NEW_TOKENS - 1
    assert generation.prefill_s > 0 and all(t > 0 for t in generation.decode_s)
    assert generation.decode_tokens_per_s * sum(generation.decode_s) == pytest.approx(len(generation.decode_s))
    assert generation.total_s == pytest.approx(generation.prefill_s + sum(generation.decode_s))
    assert session.details["onnxruntime_genai_version"]
    assert session.details["intra_op_threads"] == 1
    assert session.details["past_present_share_buffer"] is True


def test_without_a_shared_buffer_the_continuation_is_the_same(tiny_genai: TinyGenai) -> None:
    session = genai(past_present_share_buffer=False).open_session(tiny_genai.fp32)
    assert session.details["past_present_share_buffer"] is False
    assert session.generate(PROMPT, NEW_TOKENS).tokens == tiny_genai.greedy


def test_logits_at_every_position_match_pytorch_and_the_onnx_model(tiny_genai: TinyGenai) -> None:
    logits = genai().open_session(tiny_genai.fp32).logits(PROMPT)
    assert logits.shape == tiny_genai.torch_logits.shape and logits.dtype == np.float32
    np.testing.assert_allclose(logits, tiny_genai.torch_logits, atol=1e-4, rtol=1e-4)
    ort = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="c", runtime="onnxruntime")).open_session(tiny_genai.fp32)
    np.testing.assert_allclose(logits, ort.logits(PROMPT), atol=1e-5, rtol=1e-5)  # type: ignore[attr-defined]


def test_an_int4_model_loads_and_generates_the_asked_number_of_tokens(tiny_genai: TinyGenai) -> None:
    generation = genai().open_session(tiny_genai.int4).generate(PROMPT, NEW_TOKENS)
    assert len(generation.tokens) == NEW_TOKENS and len(generation.decode_s) == NEW_TOKENS - 1


def test_inference_settings_and_snippet_generate_as_measured(tiny_genai: TinyGenai) -> None:
    target = genai(intra_op_threads=1, past_present_share_buffer=True)
    session = target.open_session(tiny_genai.fp32)
    settings = target.inference_settings(session.details)
    assert settings["config_overlay"] == {
        "model": {"decoder": {"session_options": {"intra_op_num_threads": 1}}},
        "search": {"past_present_share_buffer": True},
    }
    code = target.snippet(settings, str(tiny_genai.fp32.path))
    namespace: dict[str, object] = {}
    exec(compile(code, "snippet", "exec"), namespace)
    assert namespace["generate"](PROMPT, NEW_TOKENS) == tiny_genai.greedy  # type: ignore[operator]


def test_refuses_other_formats_and_folders_without_a_genai_config(tiny_genai: TinyGenai, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(KilnError, match="genai format, got a onnx model"):
        genai().open_session(ModelArtifact.from_folder("onnx", tiny_genai.fp32.path))
    shutil.copy(tiny_genai.fp32.path / "model.onnx", tmp_path / "model.onnx")
    with pytest.raises(KilnError, match=r"no genai_config\.json"):
        genai().open_session(ModelArtifact.from_folder("genai", tmp_path))


def _genai_cuda() -> bool:
    import onnxruntime_genai

    return bool(onnxruntime_genai.is_cuda_available()) and shutil.which("nvidia-smi") is not None


@pytest.mark.skipif(_genai_cuda(), reason="this host runs onnxruntime-genai on CUDA")
def test_a_cuda_target_without_cuda_says_what_to_install(tiny_genai: TinyGenai) -> None:
    target = genai(device="cuda")
    availability = target.availability()
    assert not availability.ok
    assert "onnxruntime-genai-cuda" in availability.reason or "no NVIDIA GPU" in availability.reason
    with pytest.raises(TargetUnavailable, match="target 'g'"):
        target.open_session(tiny_genai.fp32)
    rows = {name: (ok, why) for name, ok, why in GenaiTarget.host_report()}
    assert rows["cpu"][0] and not rows["cuda"][0]


@pytest.mark.gpu
@pytest.mark.skipif(not _genai_cuda(), reason="needs onnxruntime-genai-cuda and an NVIDIA GPU")
def test_on_cuda_generation_matches_the_cpu_continuation(tiny_genai: TinyGenai) -> None:
    session = genai(device="cuda").open_session(tiny_genai.fp32)
    assert session.generate(PROMPT, NEW_TOKENS).tokens == tiny_genai.greedy
    np.testing.assert_allclose(session.logits(PROMPT), tiny_genai.torch_logits, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize(
    ("device", "named"),
    [
        ("qnn", ["QNNExecutionProvider", "onnxruntime-qnn"]),
        ("webgpu", ["WebGpuExecutionProvider", "onnxruntime-ep-webgpu"]),
        ("openvino", ["OpenVINOExecutionProvider"]),
        ("vitisai", ["Ryzen AI"]),
        ("tensorrt_rtx", ["NvTensorRTRTXExecutionProvider", "onnxruntime-ep-nv-tensorrt-rtx"]),
    ],
)
def test_an_npu_or_other_gpu_device_this_host_lacks_says_which_provider_and_package(device: str, named: list[str]) -> None:
    """Each device asks the onnxruntime the library runs on for the execution provider behind it:
    onnxruntime-genai's own flag (is_webgpu_available is true in the CPU wheel) is not enough."""
    import onnxruntime

    from targets.genai import DEVICES

    ep = DEVICES[device][3]
    if ep in onnxruntime.get_available_providers():
        pytest.skip(f"{ep} is in this onnxruntime build")
    availability = genai(device=device).availability()
    assert not availability.ok
    for word in named:
        assert word in availability.reason
    snippet = genai(device=device).snippet({"device": device}, "model")
    assert f"config.append_provider({DEVICES[device][0]!r})" in snippet


def test_a_sliding_window_wider_than_the_context_never_asks_for_more_than_the_context(tiny_genai: TinyGenai, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A Gemma 2 config keeping transformers' default window (4096) with a shorter context: the cache
    GenAI is asked for is the context at most (it refused max_length 4096 above context_length)."""
    import json

    folder = tmp_path / "windowed"
    shutil.copytree(tiny_genai.fp32.path, folder)
    config = json.loads((folder / "genai_config.json").read_text())
    context = int(config["model"]["context_length"])
    config["model"]["decoder"]["sliding_window"] = {
        "window_size": context * 16,
        "slide_key_value_cache": False,
        "slide_inputs": False,
        "layers": [],
    }
    (folder / "genai_config.json").write_text(json.dumps(config))
    session = genai().open_session(ModelArtifact.from_folder("genai", folder))
    assert session.details["sliding_window"] == context
    assert session.generate(PROMPT, NEW_TOKENS).tokens == tiny_genai.greedy
