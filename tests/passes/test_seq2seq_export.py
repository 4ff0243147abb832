"""seq2seq_export on tiny random-weight Whisper, T5, BART and Marian (2 layers, d_model 64, 128 tokens, no
tokenizer files): the encoder and the decoder with past, run by Kiln's greedy loop on onnxruntime,
generate PyTorch's greedy tokens; ort_quantize makes INT8 parts that load and generate. Each export
takes about half a minute (torch.export, twice): those tests are slow."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from seq2seq_models import tiny_seq2seq

from engine.core import ModelArtifact, PassContext, PassResult
from engine.core.errors import PassError

NEW_TOKENS = 8


def run_pass(cls: Any, model: ModelArtifact, root: Path, config: dict[str, Any] | None = None) -> PassResult:
    ctx = PassContext(step_id="step", workdir=root / "work", output_dir=root / "out")
    ctx.workdir.mkdir(parents=True)
    with contextlib.chdir(ctx.workdir):
        return cls(cls.Config(**(config or {})))(model, ctx)


@pytest.fixture(scope="module", params=["whisper", "t5", "bart", "marian"])
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, PassResult]:
    from passes.generate.seq2seq_export import Seq2SeqExport

    family = request.param
    source = tiny_seq2seq(tmp_path_factory.mktemp(f"{family}-hf"), family)
    result = run_pass(Seq2SeqExport, ModelArtifact.from_folder("hf", source), tmp_path_factory.mktemp(f"{family}-export"))
    return family, source, result


def ort_session(model: ModelArtifact) -> Any:
    from targets.onnxruntime import OnnxRuntimeTarget

    target = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="cpu", runtime="onnxruntime", intra_op_threads=1))
    return target.open_session(model)


def source_of(family: str, config: Any, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if family == "whisper":
        return {"input_features": rng.standard_normal((1, config.num_mel_bins, 2 * config.max_source_positions)).astype(np.float32)}
    ids = rng.integers(3, config.vocab_size, (1, 10)).astype(np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def torch_generate(family: str, folder: Path, source: dict[str, np.ndarray]) -> list[int]:
    import torch
    import transformers

    auto = transformers.AutoModelForSpeechSeq2Seq if family == "whisper" else transformers.AutoModelForSeq2SeqLM
    model = auto.from_pretrained(str(folder), local_files_only=True).eval()
    feeds = {name: torch.from_numpy(array) for name, array in source.items()}
    # Whisper's own generate adds language / task / timestamp tokens; the library's general one is greedy decoding as such
    generate = transformers.GenerationMixin.generate if family == "whisper" else type(model).generate
    with torch.no_grad():
        out = generate(model, **feeds, do_sample=False, max_new_tokens=NEW_TOKENS)
    return [int(t) for t in out[0, 1:]]


@pytest.mark.slow
def test_the_folder_names_an_encoder_and_a_decoder_with_past(exported: tuple[str, Path, PassResult]) -> None:
    family, _, result = exported
    folder = Path(result.model.path)
    manifest = json.loads((folder / "seq2seq.json").read_text())
    assert result.model.format == "seq2seq"
    assert manifest["task"] == ("automatic-speech-recognition" if family == "whisper" else "text2text-generation")
    decoder = onnx.load(str(folder / manifest["decoder"]["filename"]), load_external_data=False)
    inputs = [value.name for value in decoder.graph.input]
    assert inputs[:2] == ["decoder_input_ids", "encoder_hidden_states"]
    assert "past_key_values.1.decoder.key" in inputs and "past_key_values.1.encoder.value" in inputs
    assert [value.name for value in decoder.graph.output][:2] == ["logits", "present.0.decoder.key"]
    assert result.details["parity"]["greedy_match"] is True
    assert result.details["parity"]["max_abs_diff"] < 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("seed", [5, 6])
def test_the_exported_parts_generate_pytorchs_greedy_tokens(exported: tuple[str, Path, PassResult], seed: int) -> None:
    import transformers

    family, source_folder, result = exported
    source = source_of(family, transformers.AutoConfig.from_pretrained(str(source_folder)), seed)
    expected = torch_generate(family, source_folder, source)
    session = ort_session(result.model)
    got = session.generate_from(source, NEW_TOKENS, stop_at_eos=True).tokens
    session.close()
    assert len(expected) >= 2
    assert got == expected


@pytest.mark.slow
def test_the_int8_parts_load_and_generate(exported: tuple[str, Path, PassResult], tmp_path: Path) -> None:
    import transformers

    from passes.quantize.ort_quantize import OrtQuantize

    family, source_folder, result = exported
    quantized = run_pass(OrtQuantize, result.model, tmp_path, {"mode": "dynamic", "per_channel": True})
    folder = Path(quantized.model.path)
    assert quantized.model.format == "seq2seq"
    assert (folder / "seq2seq.json").read_bytes() == (Path(result.model.path) / "seq2seq.json").read_bytes()
    for name in ("encoder.onnx", "decoder.onnx"):
        ops = {node.op_type for node in onnx.load(str(folder / name)).graph.node}
        assert "MatMulInteger" in ops or "DynamicQuantizeLinear" in ops, name
    assert quantized.details["quantized_ops"]["decoder"]
    source = source_of(family, transformers.AutoConfig.from_pretrained(str(source_folder)), 5)
    session = ort_session(quantized.model)
    tokens = session.generate_from(source, NEW_TOKENS).tokens
    logits = session.first_logits(source)
    session.close()
    assert len(tokens) == NEW_TOKENS and all(0 <= token < 128 for token in tokens)
    reference = ort_session(result.model)
    assert np.abs(logits - reference.first_logits(source)).max() < 1.0  # INT8, not noise
    reference.close()


@pytest.mark.slow
def test_static_quantization_of_the_parts_is_refused_with_the_fix(exported: tuple[str, Path, PassResult], tmp_path: Path) -> None:
    from passes.quantize.ort_quantize import OrtQuantize

    with pytest.raises(PassError, match=r"dynamic mode only.*set mode: dynamic"):
        run_pass(OrtQuantize, exported[2].model, tmp_path, {"mode": "static", "calibration": "calib"})


def test_a_task_that_does_not_fit_the_model_names_the_task_to_use(tmp_path: Path) -> None:
    from passes.generate.seq2seq_export import Seq2SeqExport

    source = tiny_seq2seq(tmp_path / "t5", "t5")
    with pytest.raises(PassError, match=r"'automatic-speech-recognition' does not fit .*config.json.*use task 'text2text-generation'"):
        run_pass(Seq2SeqExport, ModelArtifact.from_folder("hf", source), tmp_path / "run", {"task": "automatic-speech-recognition"})


def test_a_decoder_only_model_is_refused_with_the_pass_to_use(tmp_path: Path) -> None:
    from decoders import tiny_decoder

    from passes.generate.seq2seq_export import Seq2SeqExport

    source = tiny_decoder(tmp_path / "llama", "llama")
    with pytest.raises(PassError, match=r"not an encoder-decoder model.*decoder_export"):
        run_pass(Seq2SeqExport, ModelArtifact.from_folder("hf", source), tmp_path / "run")
