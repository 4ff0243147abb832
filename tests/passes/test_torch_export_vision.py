"""torch_export on Hugging Face vision models: tiny random-weight ViT, ResNet, ConvNeXt, Swin,
MobileNetV2, DeiT and RegNet saved with save_pretrained; the export must match PyTorch's logits
under onnxruntime at other batch sizes, with pixel_values of the image processor's size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch
import transformers

from engine.core import ModelArtifact, PassContext, PassError
from passes.export.torch_export import TorchExport
from tests.vision_models import FAMILIES, LABELS, SIDE, TASK_MODELS, tiny_task_model, tiny_vision


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the engine runs passes with cwd = workdir


def export(folder: Path, root: Path, **options: object):
    ctx = PassContext(step_id="export", workdir=root / "work", output_dir=root / "out")
    ctx.workdir.mkdir(parents=True)
    return TorchExport(TorchExport.Config(**options))(ModelArtifact.from_folder("hf", folder), ctx)


def torch_outputs(folder: Path, auto: str, pixels: np.ndarray, field: str = "logits") -> np.ndarray:
    model = getattr(transformers, auto).from_pretrained(str(folder)).eval()
    with torch.no_grad():
        return getattr(model(pixel_values=torch.from_numpy(pixels)), field).numpy()


def run_onnx(path: Path, pixels: np.ndarray, output: str = "logits") -> np.ndarray:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run([output], {"pixel_values": pixels})[0]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_image_classification_export_matches_torch_logits(family: str, tmp_path: Path) -> None:
    folder = tiny_vision(tmp_path / family, family)
    result = export(folder, tmp_path / "export", task="image-classification")
    inputs = {io["name"]: io for io in result.details["inputs"]}
    assert list(inputs) == ["pixel_values"]
    assert inputs["pixel_values"]["shape"] == ["batch", 3, SIDE, SIDE]
    assert [io["name"] for io in result.details["outputs"]] == ["logits"]
    assert result.details["parity"]["max_abs_diff"] <= 1e-3
    pixels = np.random.default_rng(5).standard_normal((3, 3, SIDE, SIDE)).astype(np.float32)  # a batch the export never saw
    expected = torch_outputs(folder, "AutoModelForImageClassification", pixels)
    actual = run_onnx(Path(result.model.path) / "model.onnx", pixels)
    assert actual.shape == (3, LABELS)
    np.testing.assert_allclose(actual, expected, atol=1e-4)
    assert result.model.attrs["task"] == "image-classification"
    assert result.model.attrs["image_shape"] == [3, SIDE, SIDE]


def test_image_size_comes_from_the_processor_config_before_the_model_config(tmp_path: Path) -> None:
    folder = tiny_vision(tmp_path / "convnext", "convnext")  # ConvNextConfig's image_size is 224; the processor says 32
    result = export(folder, tmp_path / "export", task="image-classification")
    assert result.details["inputs"][0]["shape"] == ["batch", 3, SIDE, SIDE]
    assert any("preprocessor_config.json" in note for note in result.notes)
    assert result.model.attrs["image_processor"] == str(folder)


def test_without_a_processor_config_the_size_is_the_model_configs(tmp_path: Path) -> None:
    folder = tiny_vision(tmp_path / "vit", "vit", processor=False)
    result = export(folder, tmp_path / "export", task="image-classification")
    assert result.details["inputs"][0]["shape"] == ["batch", 3, SIDE, SIDE]
    assert any("config.json image_size" in note for note in result.notes)
    assert "image_processor" not in result.model.attrs


def test_vision_encoder_exports_last_hidden_state_for_feature_extraction(tmp_path: Path) -> None:
    folder = tiny_vision(tmp_path / "vit", "vit", model_class="ViTModel")
    result = export(folder, tmp_path / "export", task="feature-extraction")
    pixels = np.random.default_rng(2).standard_normal((1, 3, SIDE, SIDE)).astype(np.float32)
    expected = torch_outputs(folder, "AutoModel", pixels, "last_hidden_state")
    actual = run_onnx(Path(result.model.path) / "model.onnx", pixels, "last_hidden_state")
    assert actual.shape == (1, (SIDE // 8) ** 2 + 1, 32)  # the patches and the class token
    np.testing.assert_allclose(actual, expected, atol=1e-4)


def test_vision_export_is_byte_identical_twice(tmp_path: Path) -> None:
    folder = tiny_vision(tmp_path / "resnet", "resnet")
    first = export(folder, tmp_path / "one", task="image-classification")
    second = export(folder, tmp_path / "two", task="image-classification")
    assert (Path(first.model.path) / "model.onnx").read_bytes() == (Path(second.model.path) / "model.onnx").read_bytes()


def test_text_task_on_a_vision_model_is_a_pass_error_naming_the_tasks(tmp_path: Path) -> None:
    folder = tiny_vision(tmp_path / "vit", "vit")
    with pytest.raises(PassError, match=r"AutoModelForSequenceClassification cannot load this model|takes pixel_values"):
        export(folder, tmp_path / "export", task="text-classification")


def test_unknown_output_of_a_vision_model_lists_the_real_ones(tmp_path: Path) -> None:
    folder = tiny_vision(tmp_path / "resnet", "resnet")
    with pytest.raises(PassError, match="not outputs of this image-classification model; it returns"):
        export(folder, tmp_path / "export", task="image-classification", outputs=["pred_boxes"])


@pytest.mark.parametrize("name", sorted(TASK_MODELS))
def test_detection_and_segmentation_exports_match_torch(name: str, tmp_path: Path) -> None:
    folder, task = tiny_task_model(tmp_path / name, name)
    result = export(folder, tmp_path / "export", task=task)
    auto = {"object-detection": "AutoModelForObjectDetection", "semantic-segmentation": "AutoModelForSemanticSegmentation"}[task]
    fields = ["logits", "pred_boxes"] if task == "object-detection" else ["logits"]
    assert [io["name"] for io in result.details["outputs"]] == fields
    assert all(io["shape"][0] == "batch" and all(isinstance(d, int) for d in io["shape"][1:]) for io in result.details["outputs"])
    pixels = np.random.default_rng(3).standard_normal((3, 3, SIDE, SIDE)).astype(np.float32)
    for field in fields:
        np.testing.assert_allclose(
            run_onnx(Path(result.model.path) / "model.onnx", pixels, field), torch_outputs(folder, auto, pixels, field), atol=1e-4
        )


def test_an_exporter_failure_names_the_model_class_and_the_other_exporter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from passes.export import exporters

    def fails(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Unsupported: an operator the exporter lacks\nmore lines")

    monkeypatch.setattr(exporters.torch.onnx, "export", fails)
    folder = tiny_vision(tmp_path / "resnet", "resnet")
    with pytest.raises(PassError, match=r"cannot export ResNetForImageClassification \(image-classification\): Unsupported") as error:
        export(folder, tmp_path / "export", task="image-classification")
    assert "try exporter: dynamo" in str(error.value) and "more lines" not in str(error.value)
