"""An Olive Hub dataset whose config names no column, under a recipe script that picks the samples:
the column the script reads of each sample becomes hf_dataset's text column (read, never run), as in
Alibaba-NLP/gte-large-en-v1.5's recipe on allenai/c4; a script that reads several columns (a
detector's images and boxes) stays listed with its reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_olive_import import olive

from engine.olive.importer import translate

C4_SCRIPT = """
from olive.data.registry import Registry

class TextDataset:
    def __getitem__(self, idx):
        sample = self.text[idx]  # the tokenized rows it built: not the dataset's columns
        return {"input_ids": sample["input_ids"], "attention_mask": sample["attention_mask"]}

@Registry.register_pre_process()
def dataset_pre_process(dataset, **kwargs):
    from transformers import AutoTokenizer
    texts = []
    for i, sample in enumerate(dataset):
        if i >= kwargs.get("max_samples", 128):
            break
        batch_dict = AutoTokenizer.from_pretrained(kwargs.get("model_name"))(sample["text"], max_length=8192)
        texts.append({"input_ids": batch_dict["input_ids"]})
    return texts
"""

FACES_SCRIPT = """
def face_pre_process(validation_dataset, **kwargs):
    for i, sample in enumerate(validation_dataset):
        image = sample["image"]
        boxes = sample["faces"]["bbox"]
"""


def _config(folder: Path, script: str, pre: dict[str, Any]) -> dict[str, Any]:
    (folder / "script.py").write_text(script)
    data = {
        "name": "c4",
        "type": "HuggingfaceContainer",
        "user_script": "script.py",
        "load_dataset_config": {"data_name": "allenai/c4", "subset": "en", "split": "validation", "streaming": True},
        "pre_process_data_config": pre,
    }
    config = olive(folder, {"q": {"type": "OnnxStaticQuantization", "data_config": "c4"}}, data_configs=[data])
    config["input_model"] = {"type": "HfModel", "model_path": "bert", "task": "feature-extraction"}
    return config


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    (tmp_path / "bert" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
    return tmp_path


def test_the_one_column_a_recipes_script_reads_becomes_the_text_column(folder: Path) -> None:
    pre = {"type": "dataset_pre_process", "max_samples": 128, "model_name": "Alibaba-NLP/gte-large-en-v1.5"}
    translation = translate(_config(folder, C4_SCRIPT, pre), folder / "gte.json", folder)
    data = translation.workflow["data"]["c4"]
    assert {k: data[k] for k in ("source", "name", "config", "hf_split", "text_column", "limit")} == {
        "source": "hf_dataset",
        "name": "allenai/c4",
        "config": "en",
        "hf_split": "validation",
        "text_column": "text",
        "limit": 128,
    }
    assert any("reads the column 'text'" in note for note in translation.notes)
    assert not any("stand-in" in note for note in translation.notes)


def test_a_script_reading_several_columns_leaves_the_dataset_listed(folder: Path) -> None:
    translation = translate(_config(folder, FACES_SCRIPT, {"type": "face_pre_process", "size": 128}), folder / "faces.json", folder)
    assert translation.workflow["data"]["c4"]["source"] == "synthetic"  # the stand-in, said
    assert any("names none of its columns" in reason for _, reason in translation.unmapped)
