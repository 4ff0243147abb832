"""An export gives the whole model its task needs, never a part of it: decoder_export refuses an
encoder-decoder (Whisper loaded as WhisperForCausalLM exported its decoder alone, with no encoder
and no cross-attention), torch_export refuses an encoder-decoder asked for an encoder's task, and
a graph lacking an input or output of the task's model, or taking a part's input, fails the pass."""

from __future__ import annotations

from pathlib import Path

import pytest
from decoder_passes import run_pass
from kind_models import save_families

from engine.core import ModelArtifact, PassError
from passes.common.whole_model import check_whole
from passes.export.torch_export import TorchExport
from passes.generate.decoder_export import DecoderExport


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return save_families(tmp_path_factory.mktemp("kinds"))


@pytest.mark.parametrize("family", ["whisper", "t5", "bart"])
def test_decoder_export_refuses_an_encoder_decoder_naming_the_pass_that_fits(tmp_path, folders, family) -> None:
    with pytest.raises(PassError) as caught:
        run_pass(DecoderExport, ModelArtifact.from_folder("hf", folders[family]), tmp_path)
    text = str(caught.value)
    assert "encoder-decoder" in text and "use pass seq2seq_export" in text and "config.json" in text
    assert not (tmp_path / "out" / "model.onnx").exists()


def test_decoder_export_refuses_an_encoder(tmp_path, folders) -> None:
    with pytest.raises(PassError, match="use pass torch_export"):
        run_pass(DecoderExport, ModelArtifact.from_folder("hf", folders["bert"]), tmp_path)


def test_torch_export_refuses_an_encoder_decoder_asked_for_an_encoders_task(tmp_path, folders) -> None:
    with pytest.raises(PassError) as caught:
        run_pass(TorchExport, ModelArtifact.from_folder("hf", folders["whisper"]), tmp_path, task="feature-extraction")
    assert "input.task: automatic-speech-recognition" in str(caught.value) and "seq2seq_export" in str(caught.value)


def test_torch_export_of_an_encoder_passes_the_whole_model_check(tmp_path, folders) -> None:
    result = run_pass(TorchExport, ModelArtifact.from_folder("hf", folders["bert"]), tmp_path, task="feature-extraction")
    assert "input_ids" in result.model.attrs["inputs"] and result.model.attrs["outputs"] == ["last_hidden_state"]


def test_a_graph_missing_part_of_the_task_or_taking_a_parts_input_is_refused() -> None:
    needs = (["input_ids", "attention_mask"], ["logits"])
    check_whole("a causal LM", ["input_ids", "attention_mask"], ["logits"], *needs)
    with pytest.raises(ValueError, match="lacks output logits"):
        check_whole("a causal LM", ["input_ids", "attention_mask"], ["last_hidden_state"], *needs)
    with pytest.raises(ValueError, match="encoder_hidden_states, an input of part of a larger model"):
        check_whole("a causal LM", ["input_ids", "attention_mask", "encoder_hidden_states"], ["logits"], *needs)
