"""Olive's published recipes come over: a sample of microsoft/olive-recipes (data/olive_recipes, each
file's source and the corpus commit in its MANIFEST.json) covering every input_model type, every
system kind (device and execution provider) and the most frequent pass types. Each config imports,
and each translated workflow validates but for a Hub model missing from the Hugging Face cache
(offline, empty); with that model laid out in the cache, a recipe validates in full. No accelerator
of a recipe's system is dropped without being listed."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from engine_helpers import make_tiny_encoder
from hub_cache import MODEL_FILES, make_hub_cache, minilm_folder

from engine.core.errors import InputError
from engine.olive.cli import awaits_cache, load_translation, to_yaml
from engine.workflow import load_workflow

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from olive_recipes import device_changes

SAMPLE = Path(__file__).parent / "data" / "olive_recipes"
MANIFEST = json.loads((SAMPLE / "MANIFEST.json").read_text())
MISSING_MODEL = ("input.model", "input.revision")
#: a recipe whose Hub model, laid out in the cache, makes its workflow validate in full (a BERT)
FULL = "intel-bert-base-uncased-mrpc/oci/cpu/inc_smooth_quant.json"


@pytest.fixture(scope="module")
def recipes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample copied (a recipe's ONNX input, made by another recipe, is laid out beside it)."""
    folder = tmp_path_factory.mktemp("recipes")
    shutil.copytree(SAMPLE, folder, dirs_exist_ok=True)
    return folder


def olive_input(config: dict[str, Any]) -> dict[str, Any]:
    model = config["input_model"]
    return {**model, **(model.get("config") or {})}


def lay_out_onnx_input(source: Path, config: dict[str, Any]) -> None:
    """An ONNX input is the output of another recipe: a tiny model stands in where the config names it."""
    model = olive_input(config)
    path = model.get("model_path")
    if str(model.get("type", "")).lower() != "onnxmodel" or not isinstance(path, str) or Path(path).is_absolute():
        return
    file = source.parent / path
    if model.get("onnx_file_name") and not path.endswith(".onnx"):
        file = file / model["onnx_file_name"]
    if not file.exists():
        make_tiny_encoder(file)


def translate_and_validate(source: Path, dest: Path) -> tuple[Any, list[Any]]:
    config = json.loads(source.read_text())
    lay_out_onnx_input(source, config)
    translation = load_translation(source, dest)
    dest.mkdir(parents=True, exist_ok=True)
    workflow = dest / f"{source.stem}.yaml"
    workflow.write_text(to_yaml(translation, source))
    try:
        load_workflow(workflow)
    except InputError as error:
        return translation, list(error.problems)
    return translation, []


def test_the_sample_covers_the_corpus_kinds():
    assert len(MANIFEST["configs"]) >= 40
    assert all(name in MANIFEST["files"] for name in MANIFEST["configs"])
    assert sum((SAMPLE / name).stat().st_size for name in MANIFEST["files"]) < 1_000_000
    types = {str(json.loads((SAMPLE / name).read_text())["input_model"].get("type")) for name in MANIFEST["configs"]}
    assert {"HfModel", "HFModel", "PyTorchModel", "PytorchModel", "ONNXModel", "OnnxModel", "OpenVINOModel", "None"} <= types


@pytest.mark.parametrize("name", MANIFEST["configs"])
def test_each_recipe_imports_and_validates_but_for_its_hub_model(name, recipes, offline_hub, tmp_path):
    source = recipes / name
    config = json.loads(source.read_text())
    translation, problems = translate_and_validate(source, tmp_path / "kiln")
    listed = dict(translation.unmapped)
    # an input Kiln has none for (OpenVINO IR, an AzureML asset) is listed, and its placeholder path is missing;
    # so is a path on the recipe author's machine
    input_listed = "input_model.type" in listed or "input_model.model_path" in listed
    absolute = Path(str(olive_input(config).get("model_path", ""))).is_absolute()
    allowed = MISSING_MODEL + (("input.path",) if input_listed or absolute else ())
    wrong = [p for p in problems if not awaits_cache(p) and (p.where not in allowed or p.message.startswith("unknown key"))]
    assert not wrong, "\n".join(p.render() for p in wrong)
    # the importer validated what it wrote, and found the same
    assert sorted((p.where, p.message) for p in translation.problems) == sorted((p.where, p.message) for p in problems)
    for p in problems:
        if p.where.startswith("data."):  # a Hub dataset the config names, to fetch: never a stand-in for it
            assert translation.workflow["data"][p.where.split(".")[1]]["source"] == "hf_dataset"
    if any(p.where in MISSING_MODEL for p in problems):
        assert translation.workflow["input"].get("model"), "only a Hub model may be missing"
    _reported, silent = device_changes(config, translation.workflow["targets"], translation.unmapped)
    assert silent == [], f"accelerators dropped without a word: {silent}"


def test_a_recipe_validates_in_full_once_its_hub_model_is_in_the_cache(recipes, offline_hub, tmp_path):
    source = recipes / FULL
    repo = json.loads(source.read_text())["input_model"]["model_path"]
    make_hub_cache(offline_hub, repo, minilm_folder(), files=MODEL_FILES)
    glue = (
        tmp_path / "glue"
    )  # the GLUE MRPC validation split the recipe evaluates on, as `hf download glue --repo-type dataset` lays it out
    (glue / "mrpc").mkdir(parents=True)
    pq.write_table(pa.table({"sentence1": ["a"], "sentence2": ["b"], "label": [1]}), glue / "mrpc" / "validation-00000-of-00001.parquet")
    (glue / "README.md").write_text(
        "---\nconfigs:\n- config_name: mrpc\n  data_files:\n  - split: validation\n    path: mrpc/validation-*\n---\n"
    )
    make_hub_cache(offline_hub, "glue", glue, repo_type="dataset")
    translation, problems = translate_and_validate(source, tmp_path / "kiln")
    assert translation.workflow["input"] == {"format": "hf", "model": repo, "task": "text-classification"}
    assert problems == []
