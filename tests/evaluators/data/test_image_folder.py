"""The image_folder data source on tiny images written with Pillow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydantic
import pytest

from engine.core.errors import InputError
from evaluators.data.image_folder import ImageFolder

Image = pytest.importorskip("PIL.Image")


def image_folder(path: Path, **options: object) -> ImageFolder:
    return ImageFolder(ImageFolder.Config(source="image_folder", path=str(path), **options))


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """root/cat: two red images; root/dog: one blue (plus a text file that is ignored)."""
    root = tmp_path / "images"
    for name, color, count in [("cat", (255, 0, 0), 2), ("dog", (0, 0, 255), 1)]:
        (root / name).mkdir(parents=True)
        for index in range(count):
            Image.new("RGB", (6, 4), color).save(root / name / f"{index}.png")
    (root / "dog" / "notes.txt").write_text("not an image")
    return root


def test_classes_from_sorted_folders_and_nchw_pixels_in_unit_range(images: Path) -> None:
    data = image_folder(images, size=[3, 5]).load(None)
    pixels = data.inputs["input"]
    assert pixels.shape == (3, 3, 3, 5)
    assert pixels.dtype == np.float32
    assert data.labels is not None and data.labels.tolist() == [0, 0, 1]
    assert data.meta["classes"] == ["cat", "dog"]
    assert data.meta["class_counts"] == {"cat": 2, "dog": 1}
    assert pixels[0, 0].min() == 1.0 and pixels[0, 2].max() == 0.0  # red: R=1, B=0
    assert pixels[2, 2].min() == 1.0  # blue


def test_nhwc_layout_and_normalization(images: Path) -> None:
    data = image_folder(images, size=[2, 2], layout="NHWC", mean=[0.5, 0.5, 0.5], std=[0.5]).load(None)
    pixels = data.inputs["input"]
    assert pixels.shape == (3, 2, 2, 3)
    assert pixels[0, 0, 0].tolist() == [1.0, -1.0, -1.0]


def test_grayscale_gives_one_channel(images: Path) -> None:
    data = image_folder(images, size=[4, 4], grayscale=True, input_name="x").load(None)
    assert data.inputs["x"].shape == (3, 1, 4, 4)


def test_limit_per_class(images: Path) -> None:
    data = image_folder(images, size=[2, 2], limit_per_class=1).load(None)
    assert data.labels is not None and data.labels.tolist() == [0, 1]


def test_a_missing_folder_and_a_folder_without_classes_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        image_folder(tmp_path / "nowhere").load(None)
    (tmp_path / "flat").mkdir()
    Image.new("RGB", (2, 2)).save(tmp_path / "flat" / "a.png")
    with pytest.raises(InputError, match="no class sub-folders"):
        image_folder(tmp_path / "flat").load(None)


def test_an_empty_class_folder_is_an_input_error(images: Path) -> None:
    (images / "emu").mkdir()
    with pytest.raises(InputError, match="emu hold no image files"):
        image_folder(images).load(None)


def test_an_unreadable_image_is_named(images: Path) -> None:
    (images / "cat" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(InputError, match=r"broken.png"):
        image_folder(images, size=[2, 2]).load(None)


def test_config_checks_channels_and_sizes(images: Path) -> None:
    with pytest.raises(pydantic.ValidationError, match="3-channel"):
        image_folder(images, mean=[0.1, 0.2])
    with pytest.raises(pydantic.ValidationError, match="1-channel"):
        image_folder(images, grayscale=True, std=[0.1, 0.2, 0.3])
    with pytest.raises(pydantic.ValidationError):
        image_folder(images, size=[2])
    with pytest.raises(pydantic.ValidationError, match="0"):
        image_folder(images, std=[0.0])
