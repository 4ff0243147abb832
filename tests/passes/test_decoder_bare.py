"""Decoders as users bring them: tiny random Llama, Phi-3 (short config, and longrope), Gemma 2
and Gemma 3 (sliding window) saved from a bare config, without tokenizer files, through
``decoder_export`` and ``genai_build``, then the latency and generation evaluators on Kiln's loop
and on onnxruntime-genai."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from decoders import BARE, bare_decoder, greedy, torch_logits

from engine.core import ModelArtifact, PassContext
from engine.core.errors import KilnError
from engine.core.evaluator import EvalContext
from evaluators.generation import GenerationEvaluator
from evaluators.latency import Latency
from passes.generate._common import has_tokenizer
from passes.generate.decoder_export import DecoderExport
from passes.generate.genai_build import GenaiBuild
from targets.genai import GenaiConfig, GenaiTarget
from targets.onnxruntime.target import OnnxRuntimeConfig, OnnxRuntimeTarget

PROMPT = [5, 17, 33, 80, 12, 7, 41]
TARGETS = {
    "kiln-loop": lambda: OnnxRuntimeTarget(OnnxRuntimeConfig(id="cpu", runtime="onnxruntime", intra_op_threads=1)),
    "genai": lambda: GenaiTarget(GenaiConfig(id="genai", runtime="onnxruntime-genai", intra_op_threads=1)),
}
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"}


def _run(pass_cls, config: dict, hf: Path, root: Path):  # type: ignore[no-untyped-def]
    (root / "work").mkdir(parents=True)
    ctx = PassContext(step_id="s", workdir=root / "work", output_dir=root / "out")
    return pass_cls(pass_cls.Config(**config))(ModelArtifact.from_folder("hf", hf), ctx)


def _dataset():  # type: ignore[no-untyped-def]
    from engine.core.data import Dataset

    ids = np.asarray([PROMPT], dtype=np.int64)
    return Dataset(inputs={"input_ids": ids, "attention_mask": np.ones_like(ids)})


def _evaluate(model: ModelArtifact, tmp_path: Path, target_name: str) -> tuple[dict, dict]:
    ctx = EvalContext(target=TARGETS[target_name](), workdir=tmp_path, reference=None, datasets={"rows": _dataset})
    quick = {"min_rounds": 2, "max_rounds": 2, "sessions": 1, "quiet_wait_s": 0}
    timed = Latency(Latency.Config(**quick, sequence_length=16, int_high=320, warmup=1)).evaluate(model, ctx)
    assert timed.details["decoder_timing"].startswith("prefill")
    latency = timed.values
    config = {**quick, "data": "rows", "max_new_tokens": 5, "runs_per_round": 1, "warmup": 1}
    generation = GenerationEvaluator(GenerationEvaluator.Config(**config)).evaluate(model, ctx).values
    return latency, generation


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BARE))
def test_genai_build_of_a_folder_without_tokenizer(tmp_path: Path, name: str) -> None:
    hf = bare_decoder(tmp_path / "hf", name)
    assert not has_tokenizer(hf)
    result = _run(GenaiBuild, {}, hf, tmp_path / "build")
    out = Path(result.model.path)
    assert not TOKENIZER_FILES & {p.name for p in out.iterdir()}  # nothing made up
    assert "tokenizer" not in result.model.attrs
    config = json.loads((out / "genai_config.json").read_text())["model"]
    assert config["eos_token_id"] == 0 and config["decoder"]["head_size"] == 16  # the config's, no invented <eos>
    expected = greedy(hf, PROMPT, 5)
    for target_name in sorted(TARGETS):
        session = TARGETS[target_name]().open_session(result.model)
        try:
            assert session.generate(PROMPT, 5).tokens == expected, target_name
            if target_name == "kiln-loop":
                np.testing.assert_allclose(session.logits(PROMPT), torch_logits(hf, PROMPT), atol=1e-4)
        finally:
            session.close()
        latency, generation = _evaluate(result.model, tmp_path / target_name, target_name)
        assert latency["mean_ms"] > 0 and generation["decode_tokens_per_s"] > 0


@pytest.mark.slow
# phi3_longrope: the TorchScript exporter fails on transformers' longrope update (aten::copy)
@pytest.mark.parametrize("name", sorted(set(BARE) - {"phi3_longrope"}))
def test_decoder_export_of_a_folder_without_tokenizer(tmp_path: Path, name: str) -> None:
    hf = bare_decoder(tmp_path / "hf", name)
    result = _run(DecoderExport, {}, hf, tmp_path / "export")
    out = Path(result.model.path)
    assert not TOKENIZER_FILES & {p.name for p in out.iterdir()}
    assert result.details["parity"]["max_abs_diff"] < 1e-3
    session = TARGETS["kiln-loop"]().open_session(result.model)
    try:
        assert session.generate(PROMPT, 5).tokens == greedy(hf, PROMPT, 5)
    finally:
        session.close()


def test_tokenizer_settings_without_a_vocabulary_are_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert not has_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"tokenizer_config.json: tokenizer settings without a vocabulary: transformers would make up"):
        has_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    assert has_tokenizer(tmp_path)


def test_the_builder_is_handed_the_config_as_it_reads_it() -> None:
    import transformers

    from passes.generate._builder_run import adjust_config

    short = adjust_config(transformers.Phi3Config(max_position_embeddings=256))
    assert short.original_max_position_embeddings == 256  # the builder's plain Phi-3 class
    longrope = {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48}
    long = adjust_config(transformers.Phi3Config(max_position_embeddings=512, original_max_position_embeddings=64, rope_scaling=longrope))
    assert long.original_max_position_embeddings == 64  # its LongRoPE class
    gemma3 = adjust_config(transformers.Gemma3TextConfig())
    assert gemma3.rope_parameters["rope_type"] == "default" and gemma3.rope_parameters["rope_theta"] == 1_000_000.0
    assert gemma3.rope_local_base_freq == 10_000.0
    # Gemma 2's default window (4096) over a 512-token context: the window is the context
    assert transformers.Gemma2Config().sliding_window == 4096
    gemma2 = adjust_config(transformers.Gemma2Config(max_position_embeddings=512))
    assert gemma2.sliding_window == 512
    assert adjust_config(transformers.Gemma2Config(max_position_embeddings=512, sliding_window=32)).sliding_window == 32


@pytest.mark.slow
def test_a_sliding_window_longer_than_the_context_builds_a_model_that_evaluates(tmp_path: Path) -> None:
    """The config keeps transformers' default window (4096) over a 512-token context: every
    evaluation failed ("max_length (4096) cannot be greater than model context_length (512)")."""
    hf = bare_decoder(tmp_path / "hf", "gemma2_default_window")
    assert json.loads((hf / "config.json").read_text())["sliding_window"] == 4096
    model = _run(GenaiBuild, {}, hf, tmp_path / "build").model
    config = json.loads((Path(model.path) / "genai_config.json").read_text())["model"]
    assert config["context_length"] == 512 and config["decoder"]["sliding_window"]["window_size"] == 512
    target = TARGETS["genai"]()
    session = target.open_session(model)
    try:
        assert session.details["sliding_window"] == 512 and session.details["context_length"] == 512
        assert session.generate(PROMPT, 5).tokens == greedy(hf, PROMPT, 5)
        with pytest.raises(KilnError, match=r"need 513 positions, more than the model's context \(context_length 512"):
            session.generate(list(range(1, 509)), 5)
    finally:
        session.close()
    assert target.inference_settings(session.details)["search"]["min_max_length"] == 512
    _, generation = _evaluate(model, tmp_path / "genai", "genai")
    assert generation["decode_tokens_per_s"] > 0


def test_a_decoder_is_timed_on_its_ids_alone() -> None:
    from engine.core.target import GenerativeSession, TensorSpec
    from evaluators._sessions import FeedConfig, feeds_for

    class Decoder(GenerativeSession):
        def generate(self, prompt, max_new_tokens):  # type: ignore[no-untyped-def]
            raise NotImplementedError

        def logits(self, ids):  # type: ignore[no-untyped-def]
            raise NotImplementedError

    past = TensorSpec("past_key_values.0.key", "float32", ("batch_size", 2, "past_sequence_length", "kv_cache_dim"))
    ids = TensorSpec("input_ids", "int64", ("batch_size", "sequence_length"))
    mask = TensorSpec("attention_mask", "int64", ("batch_size", "total_sequence_length"))
    feeds = feeds_for(Decoder(inputs=[ids, mask, past], outputs=[], details={}), FeedConfig(sequence_length=16), None)
    assert {name: array.shape for name, array in feeds.items()} == {"input_ids": (1, 16), "attention_mask": (1, 16)}
    feeds = feeds_for(Decoder(inputs=[], outputs=[], details={}), FeedConfig(sequence_length=8), None)  # onnxruntime-genai
    assert sorted(feeds) == ["attention_mask", "input_ids"]


@pytest.mark.slow
def test_the_genai_snippet_of_a_sliding_window_model_runs(tmp_path: Path) -> None:
    import subprocess
    import sys

    hf = bare_decoder(tmp_path / "hf", "gemma2")
    model = _run(GenaiBuild, {}, hf, tmp_path / "build").model
    target = TARGETS["genai"]()
    session = target.open_session(model)
    settings = target.inference_settings(session.details)
    session.close()
    assert settings["search"]["min_max_length"] == 32
    program = target.snippet(settings, str(model.path)) + f"\nprint(generate({PROMPT}, 5))\n"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == str(greedy(hf, PROMPT, 5))
