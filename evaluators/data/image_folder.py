"""A folder of images, one sub-folder per class: resized, scaled to [0, 1], normalized, stacked;
or, with ``processor``, prepared by a Hugging Face image processor (transformers' AutoImageProcessor)
exactly as the model expects them.

Pillow is imported inside ``load``, never at module import: the engine imports this module to read
``Config`` when it validates a workflow, and ``engine --help`` must stay fast (and work where
Pillow is not installed).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from engine.core.data import Dataset, DataSource, DataSourceConfig
from engine.core.errors import MissingDependency
from engine.core.refs import FileOrInput, FilePath
from evaluators.data._tokenize import source_error

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact
    from engine.core.target import TensorSpec

logger = logging.getLogger(__name__)

#: what the image processor decides when ``processor`` is set
PROCESSOR_SETS = ("size", "resample", "grayscale", "mean", "std", "layout")
EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


def scaled(image: Any, cfg: Any) -> np.ndarray:
    """A PIL image converted (RGB, or L when ``cfg.grayscale``), resized to ``cfg.size`` and scaled to
    [0, 1]: [height, width, channels] float32. ``cfg`` has size, resample and grayscale (ImageFolder's)."""
    from PIL import Image

    filters = {
        "nearest": Image.Resampling.NEAREST,
        "bilinear": Image.Resampling.BILINEAR,
        "bicubic": Image.Resampling.BICUBIC,
        "lanczos": Image.Resampling.LANCZOS,
    }
    height, width = cfg.size
    converted = image.convert("L" if cfg.grayscale else "RGB").resize((width, height), filters[cfg.resample])
    return np.asarray(converted, dtype=np.float32).reshape(height, width, 1 if cfg.grayscale else 3) / 255.0


def normalized(pixels: np.ndarray, cfg: Any) -> np.ndarray:
    """Scaled images [samples, height, width, channels] with ``cfg.mean`` subtracted and divided by
    ``cfg.std`` per channel, in ``cfg.layout``."""
    if cfg.mean is not None:
        pixels -= np.asarray(cfg.mean, dtype=np.float32)
    if cfg.std is not None:
        pixels /= np.asarray(cfg.std, dtype=np.float32)
    if cfg.layout == "NCHW":
        pixels = np.ascontiguousarray(pixels.transpose(0, 3, 1, 2))
    return pixels


class ImageFolder(DataSource):
    name = "image_folder"
    summary = "Images in one sub-folder per class (sorted names → class ids), resized and normalized into one float32 input."
    version = "1"
    libraries = ("pillow",)

    class Config(DataSourceConfig):
        source: Literal["image_folder"] = Field(description="Reads images from one sub-folder per class.")
        path: FilePath = Field(
            description=(
                "The root folder: each sub-folder is a class named after it; class ids follow the sorted folder names. "
                "Samples come class by class, files in sorted order (use a `fraction` split for a random part)."
            )
        )
        size: list[int] = Field(
            default_factory=lambda: [224, 224], min_length=2, max_length=2, description="[height, width] every image is resized to."
        )
        resample: Literal["nearest", "bilinear", "bicubic", "lanczos"] = Field(
            default="bilinear", description="The resampling filter of the resize."
        )
        grayscale: bool = Field(default=False, description="Convert to one channel (L) instead of three (RGB).")
        mean: list[float] | None = Field(
            default=None,
            min_length=1,
            description="Subtracted per channel after pixels are scaled to [0, 1], e.g. [0.485, 0.456, 0.406]; one value for every channel. Omit for 0.",
        )
        std: list[float] | None = Field(
            default=None,
            min_length=1,
            description="Divides per channel after the mean is subtracted, e.g. [0.229, 0.224, 0.225]; one value for every channel. Omit for 1.",
        )
        layout: Literal["NCHW", "NHWC"] = Field(
            default="NCHW", description="Axis order of the input: channels first (PyTorch) or last (TensorFlow)."
        )
        input_name: str = Field(default="input", description="The model input the images feed.")
        extensions: list[str] = Field(
            default_factory=lambda: list(EXTENSIONS),
            min_length=1,
            description="File endings read as images (case-insensitive); other files are ignored.",
        )
        limit_per_class: int | None = Field(
            default=None, ge=1, description="Keep at most the first N images (sorted by name) of each class. Omit for all."
        )
        processor: FileOrInput | None = Field(
            default=None,
            description=(
                "`input` for the image processor saved with the workflow's input model (its preprocessor_config.json), or a "
                "folder holding one: images are resized, cropped and normalized by transformers' AutoImageProcessor, and "
                "size, resample, grayscale, mean, std and layout do not apply. input_name `input` (the default) becomes the "
                "processor's (pixel_values)."
            ),
        )

        @model_validator(mode="after")
        def _check_channels(self) -> ImageFolder.Config:
            channels = 1 if self.grayscale else 3
            for option in ("mean", "std"):
                values = getattr(self, option)
                if values is not None and len(values) not in (1, channels):
                    raise ValueError(f"`{option}` has {len(values)} values for {channels}-channel images: give 1 or {channels}")
            if self.std is not None and any(value == 0 for value in self.std):
                raise ValueError("`std` values must not be 0")
            if any(side < 1 for side in self.size):
                raise ValueError("`size` values must be at least 1")
            # compared with the defaults, not model_fields_set: a config read back from its JSON sets every field
            manual = [
                name
                for name in PROCESSOR_SETS
                if getattr(self, name) != type(self).model_fields[name].get_default(call_default_factory=True)
            ]
            if self.processor is not None and manual:
                raise ValueError(f"the image processor sizes and normalizes the images: remove {', '.join(manual)} (or `processor`)")
            return self

    config: Config

    def _error(self, where: str, message: str, **parts: str | None) -> Any:
        return source_error(self.name, where, message, **parts)

    def find_images(self) -> tuple[list[str], list[tuple[Path, int]]]:
        """Class names (sorted) and (file, class id) pairs, class by class, files sorted."""
        root = Path(self.config.path)
        if not root.is_dir():
            raise self._error(
                "path",
                "the image folder does not exist" if not root.exists() else "the path is not a folder",
                given=str(root),
                hint="give the root folder that holds one sub-folder per class",
            )
        classes = sorted(entry.name for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith("."))
        if not classes:
            raise self._error(
                "path",
                "the folder has no class sub-folders",
                given=str(root),
                hint="put each class's images in a sub-folder named after the class",
            )
        endings = tuple(ext.lower() if ext.startswith(".") else f".{ext.lower()}" for ext in self.config.extensions)
        samples: list[tuple[Path, int]] = []
        empty = []
        for index, name in enumerate(classes):
            files = sorted(f for f in (root / name).iterdir() if f.is_file() and f.suffix.lower() in endings)
            if self.config.limit_per_class is not None:
                files = files[: self.config.limit_per_class]
            if not files:
                empty.append(name)
            samples.extend((file, index) for file in files)
        if empty:
            raise self._error(
                "path",
                f"class folder(s) {', '.join(empty)} hold no image files",
                given=str(root),
                expected=f"files ending in {', '.join(endings)}",
                hint="add images, remove the empty folders, or widen `extensions`",
            )
        return classes, samples

    def load(self, input_model: ModelArtifact | None, signature: list[TensorSpec] | None = None) -> Dataset:
        try:
            from PIL import Image, UnidentifiedImageError
        except ImportError as error:
            raise MissingDependency("pillow", "the image_folder data source") from error
        cfg = self.config
        classes, samples = self.find_images()
        if cfg.processor is not None:
            from evaluators.data._images import processed

            name, pixels = processed(self.name, samples, cfg.processor, None if cfg.input_name == "input" else cfg.input_name, input_model)
            return self._dataset(classes, samples, name, pixels)
        height, width = cfg.size
        channels = 1 if cfg.grayscale else 3
        pixels = np.empty((len(samples), height, width, channels), dtype=np.float32)
        for row, (file, _) in enumerate(samples):
            try:
                with Image.open(file) as image:
                    pixels[row] = scaled(image, cfg)
            except (UnidentifiedImageError, OSError, ValueError) as error:
                raise self._error(
                    "path", f"cannot read image {file}: {error}", given=str(file), hint="remove or replace the file"
                ) from error
        return self._dataset(classes, samples, cfg.input_name, normalized(pixels, cfg))

    def _dataset(self, classes: list[str], samples: list[tuple[Path, int]], input_name: str, pixels: np.ndarray) -> Dataset:
        cfg = self.config
        labels = np.asarray([label for _, label in samples], dtype=np.int64)
        root = Path(cfg.path)
        meta = {
            "source": self.name,
            "path": str(root),
            "samples": len(samples),
            "classes": classes,
            "class_counts": {name: int((labels == index).sum()) for index, name in enumerate(classes)},
            "shape": list(pixels.shape[1:]),
            "layout": "NCHW" if cfg.processor is not None else cfg.layout,
            "inputs": [input_name],
        }
        if cfg.processor is not None:
            meta["processor"] = cfg.processor
        logger.debug("image_folder: %d images of %d classes from %s", len(samples), len(classes), root)
        return Dataset(inputs={input_name: pixels}, labels=labels, meta=meta)
