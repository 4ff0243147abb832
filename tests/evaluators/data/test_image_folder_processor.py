"""image_folder with `processor`: PNG and JPEG images prepared by the model's own image processor
(transformers' AutoImageProcessor), as pixel_values of the size the model takes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydantic
import pytest

from engine.core.artifact import ModelArtifact
from engine.core.errors import InputError
from evaluators.data.image_folder import ImageFolder
from tests.vision_models import SIDE, processor_config, write_images

pytest.importorskip("PIL.Image")


def image_folder(path: Path, **options: object) -> ImageFolder:
    return ImageFolder(ImageFolder.Config(source="image_folder", path=str(path), **options))


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    """What load reads of a model folder: config.json and preprocessor_config.json (no weights needed)."""
    import json

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "vit", "architectures": ["ViTForImageClassification"]}))
    (folder / "preprocessor_config.json").write_text(json.dumps(processor_config()))
    return folder


def test_images_come_out_as_the_processor_makes_them(tmp_path: Path, model_folder: Path) -> None:
    from PIL import Image
    from transformers import AutoImageProcessor

    root = write_images(tmp_path / "images")
    data = image_folder(root, processor="input").load(ModelArtifact.from_folder("hf", model_folder))
    pixels = data.inputs["pixel_values"]
    assert pixels.shape == (6, 3, SIDE, SIDE) and pixels.dtype == np.float32
    assert list(data.labels) == [0, 0, 0, 1, 1, 1]
    processor = AutoImageProcessor.from_pretrained(str(model_folder))
    with Image.open(root / "class1" / "img1.jpg") as image:
        expected = processor(images=[image.convert("RGB")], return_tensors="np")["pixel_values"][0]
    np.testing.assert_allclose(pixels[4], expected, atol=1e-6)
    assert -1.0 <= pixels.min() < 0 < pixels.max() <= 1.0  # rescaled to [0, 1], normalized with 0.5 / 0.5
    assert data.meta["inputs"] == ["pixel_values"] and data.meta["shape"] == [3, SIDE, SIDE]


def test_an_exported_model_finds_the_processor_of_the_folder_it_came_from(tmp_path: Path, model_folder: Path) -> None:
    exported = tmp_path / "onnx"
    exported.mkdir()
    (exported / "model.onnx").write_bytes(b"not read")
    model = ModelArtifact(format="onnx", path=exported, digest="", attrs={"image_processor": str(model_folder)})
    data = image_folder(write_images(tmp_path / "images", per_class=1), processor="input", input_name="images").load(model)
    assert data.inputs["images"].shape == (2, 3, SIDE, SIDE)


def test_a_folder_as_processor(tmp_path: Path, model_folder: Path) -> None:
    data = image_folder(write_images(tmp_path / "images", per_class=1), processor=str(model_folder)).load(None)
    assert data.inputs["pixel_values"].shape == (2, 3, SIDE, SIDE)


def test_processor_input_without_one_is_an_input_error_with_the_fix(tmp_path: Path) -> None:
    root = write_images(tmp_path / "images", per_class=1)
    with pytest.raises(InputError, match="`processor: input` needs"):
        image_folder(root, processor="input").load(None)
    (tmp_path / "bare").mkdir()
    with pytest.raises(InputError, match=r"holds no preprocessor_config\.json") as error:
        image_folder(root, processor=str(tmp_path / "bare")).load(None)
    assert "save_pretrained" in str(error.value)


def test_manual_preprocessing_options_beside_a_processor_are_refused(tmp_path: Path) -> None:
    with pytest.raises(pydantic.ValidationError, match="remove size, mean"):
        ImageFolder.Config(source="image_folder", path=str(tmp_path), processor="input", size=[16, 16], mean=[0.5])
    # the defaults written out, as a config read back from its JSON has them, are accepted
    written = ImageFolder.Config(source="image_folder", path=str(tmp_path), processor="input").model_dump(mode="json")
    assert ImageFolder.Config.model_validate(written).processor == "input"
