"""The text_lines data source with a tiny WordPiece tokenizer built offline."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pydantic
import pytest

from engine.core.artifact import ModelArtifact
from engine.core.errors import InputError
from engine.core.refs import RefKind, references
from evaluators.data.text_lines import TextLines

LINES = ["the cat sat", "", "a dog ran far away on the mat", "   ", "the mat"]


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "sentences.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def hf_model(tmp_path: Path, tokenizer_dir: Path) -> ModelArtifact:
    folder = tmp_path / "hf-model"
    shutil.copytree(tokenizer_dir, folder)
    return ModelArtifact(format="hf", path=folder, digest="0" * 64)


def text_lines(path: Path, **options: object) -> TextLines:
    return TextLines(TextLines.Config(source="text_lines", path=str(path), **options))


def test_lines_become_padded_int64_arrays_of_max_length(text_file: Path, hf_model: ModelArtifact) -> None:
    data = text_lines(text_file, max_length=12).load(hf_model)
    assert set(data.inputs) == {"input_ids", "attention_mask", "token_type_ids"}
    assert len(data) == 3  # the two blank lines are skipped
    for array in data.inputs.values():
        assert array.shape == (3, 12)
        assert array.dtype == np.int64
    # [CLS] the cat sat [SEP] then padding
    assert data.inputs["attention_mask"][0].tolist() == [1] * 5 + [0] * 7
    assert data.inputs["input_ids"][0, 0] == 2 and data.inputs["input_ids"][0, 4] == 3
    assert data.inputs["input_ids"][0, 5:].tolist() == [0] * 7
    assert data.meta["sequence_length"] == 12


def test_known_words_map_to_their_vocabulary_ids(text_file: Path, hf_model: ModelArtifact) -> None:
    data = text_lines(text_file).load(hf_model)
    # vocabulary: [PAD] [UNK] [CLS] [SEP] [MASK] the cat sat on a mat dog ran far away
    assert data.inputs["input_ids"][2, :3].tolist() == [2, 5, 10]  # [CLS] the mat


def test_longest_padding_pads_to_the_longest_line(text_file: Path, hf_model: ModelArtifact) -> None:
    data = text_lines(text_file, padding="longest").load(hf_model)
    longest = 2 + len("a dog ran far away on the mat".split())
    assert data.inputs["input_ids"].shape == (3, longest)
    assert data.inputs["attention_mask"][1].all()


def test_truncation_cuts_long_lines_and_counts_them(text_file: Path, hf_model: ModelArtifact) -> None:
    data = text_lines(text_file, max_length=4).load(hf_model)
    assert data.inputs["input_ids"].shape == (3, 4)
    assert data.inputs["input_ids"][:, -1].tolist() == [3, 3, 3]  # every row still ends with [SEP]
    assert data.meta["truncated_samples"] == 2


def test_a_long_line_without_truncation_is_an_input_error(text_file: Path, hf_model: ModelArtifact) -> None:
    with pytest.raises(InputError, match="truncation"):
        text_lines(text_file, max_length=4, truncation=False).load(hf_model)


def test_limit_keeps_the_first_non_blank_lines(text_file: Path, hf_model: ModelArtifact) -> None:
    data = text_lines(text_file, limit=2).load(hf_model)
    assert len(data) == 2
    assert data.inputs["input_ids"][1, 1] == 9  # "a": the second non-blank line


def test_blank_lines_are_kept_as_samples_when_asked(text_file: Path, hf_model: ModelArtifact) -> None:
    data = text_lines(text_file, skip_blank=False).load(hf_model)
    assert len(data) == 5
    assert data.inputs["attention_mask"][1].sum() == 2  # just [CLS] [SEP]


def test_a_tokenizer_folder_can_be_given_instead_of_the_input_model(text_file: Path, tokenizer_dir: Path) -> None:
    onnx_model = ModelArtifact(format="onnx", path=text_file.parent, digest="0" * 64)
    data = text_lines(text_file, tokenizer=str(tokenizer_dir)).load(onnx_model)
    assert data.meta["tokenizer"] == str(tokenizer_dir)
    assert len(data) == 3


def test_a_missing_file_is_an_input_error_naming_the_path(tmp_path: Path, hf_model: ModelArtifact) -> None:
    missing = tmp_path / "nowhere.txt"
    with pytest.raises(InputError, match="does not exist") as caught:
        text_lines(missing).load(hf_model)
    assert str(missing) in str(caught.value)


@pytest.mark.parametrize("content", ["", "\n  \n\n"])
def test_an_empty_file_is_an_input_error(tmp_path: Path, hf_model: ModelArtifact, content: str) -> None:
    path = tmp_path / "empty.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match="no samples"):
        text_lines(path).load(hf_model)


def test_a_folder_without_tokenizer_files_is_an_input_error_listing_the_expected(text_file: Path, tmp_path: Path) -> None:
    empty = tmp_path / "no-tokenizer"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(InputError, match="no tokenizer files") as caught:
        text_lines(text_file, tokenizer=str(empty)).load(None)
    assert "tokenizer.json" in str(caught.value) and "vocab.txt" in str(caught.value)


def test_a_missing_tokenizer_folder_is_an_input_error(text_file: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        text_lines(text_file, tokenizer=str(tmp_path / "gone")).load(None)


def test_tokenizer_input_needs_a_hugging_face_input_model(text_file: Path) -> None:
    onnx_model = ModelArtifact(format="onnx", path=text_file.parent, digest="0" * 64)
    with pytest.raises(InputError, match="Hugging Face") as caught:
        text_lines(text_file).load(onnx_model)
    assert "onnx input model" in str(caught.value)


def test_loading_reads_offline_and_gives_the_hub_switch_back(
    text_file: Path, hf_model: ModelArtifact, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    data = text_lines(text_file).load(hf_model)
    assert len(data.inputs["input_ids"]) > 0
    assert "HF_HUB_OFFLINE" not in os.environ


def test_config_rejects_unknown_padding_and_keys(text_file: Path) -> None:
    with pytest.raises(pydantic.ValidationError):
        text_lines(text_file, padding="right")
    with pytest.raises(pydantic.ValidationError):
        text_lines(text_file, lowercase=True)
    assert sorted(references(TextLines.Config)[RefKind.FILE]) == ["path", "tokenizer"]


def test_a_decoder_tokenizer_without_a_pad_token_pads_with_its_end_of_sequence(text_file: Path, tmp_path: Path) -> None:
    from decoders import tokenizer

    folder = tmp_path / "decoder-tokenizer"
    tok = tokenizer()
    assert tok.pad_token is None
    tok.save_pretrained(str(folder))
    data = text_lines(text_file, tokenizer=str(folder), padding="longest").load(None)
    mask, ids = data.inputs["attention_mask"], data.inputs["input_ids"]
    assert data.meta["padded_with"] == "<|endoftext|>"
    assert mask[0].sum() < mask.shape[1]  # the short line is padded, and the mask says where
    assert (ids[mask == 0] == tok.eos_token_id).all()
    assert ids[0][mask[0] == 1].tolist() == tok("the cat sat")["input_ids"]
