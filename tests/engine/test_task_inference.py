"""The input's task read from config.json's architectures when the workflow gives none (optimum's
task names), filled into the steps that take the task, and said by `engine validate` and `engine plan`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import write_workflow

from engine.cli.main import main
from engine.workflow import load_workflow
from engine.workflow.tasks import infer_task, task_of_architecture, task_of_config


@pytest.mark.parametrize(
    ("architecture", "model_type", "task"),
    [
        ("ViTForImageClassification", "vit", "image-classification"),
        ("ResNetForImageClassification", "resnet", "image-classification"),
        ("DeiTForImageClassificationWithTeacher", "deit", "image-classification"),
        ("ViTModel", "vit", "feature-extraction"),
        ("BertModel", "bert", "feature-extraction"),
        ("BertForSequenceClassification", "bert", "text-classification"),
        ("BertForTokenClassification", "bert", "token-classification"),
        ("BertForQuestionAnswering", "bert", "question-answering"),
        ("BertForMaskedLM", "bert", "fill-mask"),
        ("LlamaForCausalLM", "llama", "text-generation"),
        ("GPT2LMHeadModel", "gpt2", "text-generation"),
        ("T5ForConditionalGeneration", "t5", "text2text-generation"),
        ("BartForConditionalGeneration", "bart", "text2text-generation"),
        ("WhisperForConditionalGeneration", "whisper", "automatic-speech-recognition"),
        ("Wav2Vec2ForCTC", "wav2vec2", "automatic-speech-recognition"),
        ("Wav2Vec2ForSequenceClassification", "wav2vec2", "audio-classification"),
        ("DetrForObjectDetection", "detr", "object-detection"),
        ("YolosForObjectDetection", "yolos", "object-detection"),
        ("SegformerForSemanticSegmentation", "segformer", "semantic-segmentation"),
        ("BlipForConditionalGeneration", "blip", "image-to-text"),
        ("VisionEncoderDecoderModel", "vision-encoder-decoder", "image-to-text"),
        ("CLIPModel", "clip", "zero-shot-image-classification"),
    ],
)
def test_architecture_names_the_task_optimum_names(architecture: str, model_type: str, task: str) -> None:
    assert task_of_architecture(architecture, model_type) == task


@pytest.mark.parametrize(
    "config", [{}, {"architectures": []}, {"architectures": ["BertForPreTraining"]}, {"architectures": "BertModel"}, []]
)
def test_no_readable_architecture_infers_nothing(config: Any) -> None:
    assert task_of_config(config) == (None, None)


def test_first_architecture_decides(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["ViTForImageClassification", "ViTModel"], "model_type": "vit"}))
    assert infer_task(tmp_path) == ("image-classification", "ViTForImageClassification")
    assert infer_task(tmp_path / "missing") == (None, None)


def hf_folder(folder: Path, architecture: str, model_type: str) -> Path:
    """config.json and a weights file: all `engine validate` reads (it never loads the weights)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [architecture], "model_type": model_type}))
    (folder / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    return folder


def workflow(model: Path, task: str | None = None, steps: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    source: dict[str, Any] = {"format": "hf", "path": str(model), **({"task": task} if task else {})}
    return {
        "version": 1,
        "name": "infer",
        "input": source,
        "targets": [{"id": "cpu", "runtime": "onnxruntime"}],
        "steps": steps or [{"id": "export", "pass": "torch_export"}],
        "evaluate": [{"id": "size", "evaluator": "size"}],
        "select": {"objective": {"metric": "size.file_bytes", "goal": "min"}},
    }


def test_vision_folder_without_task_exports_for_image_classification(tmp_path: Path) -> None:
    model = hf_folder(tmp_path / "vit", "ViTForImageClassification", "vit")
    resolved = load_workflow(write_workflow(tmp_path, workflow(model)))
    assert resolved.input.attrs["task"] == "image-classification"
    assert resolved.steps["export"].config["task"] == "image-classification"
    assert resolved.steps["export"].filled == {"task": "config.json architectures"}
    assert resolved.input.notes == ["task: image-classification (inferred from config.json: architectures [ViTForImageClassification])"]


def test_the_workflows_task_wins_over_the_config(tmp_path: Path) -> None:
    model = hf_folder(tmp_path / "vit", "ViTForImageClassification", "vit")
    resolved = load_workflow(write_workflow(tmp_path, workflow(model, task="feature-extraction")))
    assert resolved.steps["export"].config["task"] == "feature-extraction"
    assert resolved.steps["export"].filled == {"task": "input.task"}
    assert resolved.input.notes == []


def test_a_step_that_sets_the_task_keeps_it(tmp_path: Path) -> None:
    model = hf_folder(tmp_path / "vit", "ViTForImageClassification", "vit")
    steps = [{"id": "export", "pass": "torch_export", "config": {"task": "feature-extraction"}}]
    resolved = load_workflow(write_workflow(tmp_path, workflow(model, steps=steps)))
    assert resolved.steps["export"].config["task"] == "feature-extraction" and resolved.steps["export"].filled == {}


def test_an_inferred_task_the_pass_does_not_take_leaves_its_default(tmp_path: Path) -> None:
    """A causal LM exported by torch_export stays a feature-extraction export, as before the task was inferred."""
    model = hf_folder(tmp_path / "llama", "LlamaForCausalLM", "llama")
    resolved = load_workflow(write_workflow(tmp_path, workflow(model)))
    assert resolved.input.attrs["task"] == "text-generation"
    assert resolved.steps["export"].config["task"] == "feature-extraction" and resolved.steps["export"].filled == {}


def test_validate_and_plan_say_which_task_was_inferred(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = hf_folder(tmp_path / "resnet", "ResNetForImageClassification", "resnet")
    file = write_workflow(tmp_path, {**workflow(model), "cache": {"dir": str(tmp_path / "store")}})
    assert main(["validate", str(file)]) == 0
    said = capsys.readouterr().out
    assert "task: image-classification (inferred from config.json: architectures [ResNetForImageClassification])" in said
    assert main(["plan", str(file)]) == 0
    assert "task: image-classification (inferred from config.json" in capsys.readouterr().out
