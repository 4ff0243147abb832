"""The hf_dataset data source: a Hugging Face Hub dataset read from a Hub cache laid out by hand (the
layout `hf download ORG/NAME --repo-type dataset` writes: parquet files and a README naming the
configs), offline. Validation pins the commit, a missing dataset is one clear error naming the
dataset, the cache folder and the command that fetches it, and a run calibrates on it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pydantic
import pytest
from engine_helpers import engine_cmd, make_tiny_encoder, tiny_workflow, write_workflow
from hub_cache import make_hub_cache

from engine.core.errors import InputError
from engine.workflow import load_workflow
from evaluators.data.hf_dataset import HfDataset

REPO = "org/tiny-sst"
COMMIT = "c" * 40
README = """---
configs:
- config_name: plain_text
  data_files:
  - split: train
    path: plain_text/train-*
  - split: validation
    path: plain_text/validation-*
---
"""
WORDS = ["good", "bad", "movie", "film", "fine", "dull"]


def lay_out(cache: Path, commit: str = COMMIT, rows: int = 12) -> Path:
    """A GLUE-like dataset (sentence, label) in the Hub cache as REPO at ``commit`` (main)."""
    files = cache.parent / f"files-{commit[:4]}"
    (files / "plain_text").mkdir(parents=True, exist_ok=True)
    sentences = [f"{WORDS[i % 6]} {WORDS[(i + 2) % 6]}" for i in range(rows)]
    table = pa.table({"sentence": sentences, "label": [i % 2 for i in range(rows)]})
    pq.write_table(table, files / "plain_text" / "train-00000-of-00001.parquet")
    pq.write_table(table.slice(0, 4), files / "plain_text" / "validation-00000-of-00001.parquet")
    (files / "README.md").write_text(README)
    return make_hub_cache(cache, REPO, files, commit=commit, repo_type="dataset")


def tokenizer_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "tokenizer"
    folder.mkdir(parents=True)
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS]) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True}))
    return folder


def hf_workflow(tmp_path: Path, **data: object) -> Path:
    model = make_tiny_encoder(tmp_path / "models" / "tiny.onnx")
    workflow = tiny_workflow(model)
    workflow["data"] = {
        "rows": {
            "source": "hf_dataset",
            "name": REPO,
            "config": "plain_text",
            "hf_split": "train",
            "text_column": "sentence",
            "label_column": "label",
            "tokenizer": str(tokenizer_folder(tmp_path)),
            "max_length": 8,
            **data,
        }
    }
    workflow["steps"] = [{"id": "int8", "pass": "ort_quantize", "config": {"mode": "static", "calibration": "rows"}}]
    return write_workflow(tmp_path, workflow)


def test_validation_pins_the_cached_commit(tmp_path, offline_hub):
    snapshot = lay_out(offline_hub)
    entry = load_workflow(hf_workflow(tmp_path)).datasets["rows"]
    assert entry.config["commit"] == COMMIT and entry.config["folder"] == str(snapshot)


def test_a_dataset_missing_from_the_cache_names_it_the_cache_and_the_fetch_command(tmp_path, offline_hub):
    with pytest.raises(InputError) as caught:
        load_workflow(hf_workflow(tmp_path))
    (problem,) = [p for p in caught.value.problems if p.where == "data.rows.name"]
    assert f"the Hub dataset {REPO} is not in the Hugging Face datasets cache ({offline_hub})" in problem.message
    assert problem.hint and f"hf download {REPO} --repo-type dataset" in problem.hint
    done = subprocess.run([*engine_cmd(), "validate", str(tmp_path / "workflow.yaml")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "data.rows.name" in done.stderr


def test_a_revision_not_in_the_cache_lists_those_it_holds(tmp_path, offline_hub):
    lay_out(offline_hub)
    with pytest.raises(InputError) as caught:
        load_workflow(hf_workflow(tmp_path, revision="v2"))
    (problem,) = [p for p in caught.value.problems if p.where == "data.rows.revision"]
    assert "main (cccccccccccc)" in (problem.expected or "")


def test_commit_and_folder_are_kilns_to_set(tmp_path, offline_hub):
    lay_out(offline_hub)
    with pytest.raises(InputError) as caught:
        load_workflow(hf_workflow(tmp_path, commit=COMMIT))
    assert [p.where for p in caught.value.problems] == ["data.rows.commit"]


def test_the_rows_become_tokenized_samples_and_labels(tmp_path, offline_hub, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    snapshot = lay_out(offline_hub)
    config = {"source": "hf_dataset", "name": REPO, "config": "plain_text", "hf_split": "validation", "text_column": "sentence"}
    source = HfDataset(
        HfDataset.Config(
            **config, label_column="label", tokenizer=str(tokenizer_folder(tmp_path)), max_length=6, folder=str(snapshot), commit=COMMIT
        )
    )
    data = source.load(None)
    assert len(data) == 4 and data.labels is not None and data.labels.tolist() == [0, 1, 0, 1]
    assert data.inputs["input_ids"].shape == (4, 6) and data.inputs["input_ids"][0, 0] == 2  # [CLS]
    limited = HfDataset(
        HfDataset.Config(**{**config, "hf_split": "train"}, limit=5, tokenizer=str(tokenizer_folder(tmp_path / "b")), folder=str(snapshot))
    ).load(None)
    assert len(limited) == 5


def test_a_split_the_dataset_lacks_is_a_clear_error(tmp_path, offline_hub, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    snapshot = lay_out(offline_hub)
    source = HfDataset(
        HfDataset.Config(source="hf_dataset", name=REPO, config="plain_text", hf_split="test", text_column="sentence", folder=str(snapshot))
    )
    with pytest.raises(InputError) as caught:
        source.load(None)
    assert caught.value.problems[0].where == "hf_dataset.hf_split"


def test_a_run_calibrates_on_the_hub_dataset_offline_and_locks_its_commit(tmp_path, offline_hub):
    lay_out(offline_hub)
    path = hf_workflow(tmp_path)
    env_run = subprocess.run(
        [*engine_cmd(), "run", str(path), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "datasets-cache"), "HF_DATASETS_OFFLINE": "1"},
    )
    assert env_run.returncode == 0, env_run.stdout[-3000:] + env_run.stderr[-3000:]
    lock = json.loads((tmp_path / "out" / "workflow.lock.json").read_text())
    assert lock["hub_datasets"]["rows"]["commit"] == COMMIT
    candidates = json.loads((tmp_path / "out" / "candidates.json").read_text())
    text = json.dumps(candidates)
    assert "int8" in text
    # another commit of the same dataset is another dataset key
    key = lock["datasets"]["rows"]
    lay_out(offline_hub, commit="d" * 40, rows=10)
    second = subprocess.run(
        [*engine_cmd(), "run", str(path), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out2")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "datasets-cache")},
    )
    assert second.returncode == 0, second.stderr[-3000:]
    lock2 = json.loads((tmp_path / "out2" / "workflow.lock.json").read_text())
    assert lock2["hub_datasets"]["rows"]["commit"] == "d" * 40 and lock2["datasets"]["rows"] != key


def test_a_sentence_pair_and_a_joined_corpus(tmp_path, offline_hub, monkeypatch):
    """text_pair_column tokenizes each row's two texts as a pair ([CLS] a [SEP] b [SEP]); join cuts the
    split's joined text into samples of exactly max_length tokens (a language model's calibration)."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    snapshot = lay_out(offline_hub)
    tokenizer = str(tokenizer_folder(tmp_path))
    base = {
        "source": "hf_dataset",
        "name": REPO,
        "config": "plain_text",
        "text_column": "sentence",
        "tokenizer": tokenizer,
        "folder": str(snapshot),
    }
    pairs = HfDataset(HfDataset.Config(**base, hf_split="validation", text_pair_column="sentence", max_length=8)).load(None)
    assert pairs.inputs["input_ids"][0].tolist() == [2, 4, 6, 3, 4, 6, 3, 0]  # good movie / good movie
    assert pairs.inputs["token_type_ids"][0].tolist()[:7] == [0, 0, 0, 0, 1, 1, 1]
    joined = HfDataset(HfDataset.Config(**base, hf_split="train", join=True, max_length=5)).load(None)
    assert joined.inputs["input_ids"].shape == (4, 5)  # 12 rows of 2 words: 24 tokens, 4 samples of 5
    assert joined.inputs["input_ids"][0].tolist() == [4, 6, 5, 7, 6]  # good movie, bad film, movie
    assert int(joined.inputs["attention_mask"].min()) == 1 and joined.meta["joined_rows"] == 12


def test_an_image_column_becomes_normalized_pixels_with_labels(tmp_path, offline_hub, monkeypatch):
    """A dataset of images (timm/mini-imagenet's shape: image, label) laid out as parquet with the
    datasets library's Image feature: resized, scaled, normalized, NCHW."""
    import datasets
    from PIL import Image

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    files = tmp_path / "images"
    (files / "data").mkdir(parents=True)
    images = [Image.new("RGB", (10, 6), color) for color in ((255, 0, 0), (0, 0, 255), (255, 255, 255))]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    datasets.Dataset.from_dict({"image": images, "label": [3, 1, 0]}, features=features).to_parquet(
        str(files / "data" / "validation-00000.parquet")
    )
    snapshot = make_hub_cache(offline_hub, "org/tiny-images", files, repo_type="dataset")
    config = HfDataset.Config(
        source="hf_dataset",
        name="org/tiny-images",
        hf_split="validation",
        image_column="image",
        label_column="label",
        size=[4, 4],
        mean=[0.5],
        std=[0.5],
        folder=str(snapshot),
    )
    data = HfDataset(config).load(None)
    pixels = data.inputs["input"]
    assert pixels.shape == (3, 3, 4, 4) and data.labels is not None and data.labels.tolist() == [3, 1, 0]
    assert pixels[0, :, 0, 0].tolist() == [1.0, -1.0, -1.0] and pixels[1, :, 0, 0].tolist() == [-1.0, -1.0, 1.0]
    with pytest.raises(pydantic.ValidationError, match="exactly one of"):
        HfDataset.Config(source="hf_dataset", name="org/x", image_column="image", text_column="t")
