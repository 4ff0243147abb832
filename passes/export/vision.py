"""Vision models of a Hugging Face folder as an ``ExportSource``: one ``pixel_values`` input
(batch, channels, height, width) with a dynamic batch, its size read from the folder's image
processor config (preprocessor_config.json) or the model's config.

Imported by ``sources`` only when a vision model is exported: torch is heavy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

#: the file ``save_pretrained`` of an image processor writes
PROCESSOR_FILE = "preprocessor_config.json"
#: the outputs exported when the step names none, by task
DEFAULT_OUTPUTS = {
    "feature-extraction": ("last_hidden_state",),
    "image-classification": ("logits",),
    "object-detection": ("logits", "pred_boxes"),
    "semantic-segmentation": ("logits",),
}
#: batch sizes of the export example and of the second example (the batch axis is checked dynamic)
BATCHES = (2, 1)
#: the side of the image when neither the processor nor the config says it
DEFAULT_SIDE = 224


def image_shape(folder: Path, config: Any) -> tuple[tuple[int, int, int], str]:
    """(channels, height, width) of ``pixel_values``, and where the size was read."""
    channels = getattr(config, "num_channels", None)
    channels = int(channels) if isinstance(channels, int) and channels > 0 else 3
    size = _processor_size(folder)
    if size is not None:
        return (channels, *size), PROCESSOR_FILE
    side = getattr(config, "image_size", None)
    if isinstance(side, int) and side > 0:
        return (channels, side, side), "config.json image_size"
    if isinstance(side, (list, tuple)) and len(side) == 2 and all(isinstance(s, int) and s > 0 for s in side):
        return (channels, int(side[0]), int(side[1])), "config.json image_size"
    return (channels, DEFAULT_SIDE, DEFAULT_SIDE), f"neither {PROCESSOR_FILE} nor config.json states it: {DEFAULT_SIDE}"


def _processor_size(folder: Path) -> tuple[int, int] | None:
    """The (height, width) the image processor hands the model: its crop when it center-crops,
    else its resize. A ``shortest_edge`` alone gives a square of that side."""
    try:
        processor = json.loads((folder / PROCESSOR_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(processor, dict):
        return None
    order = ("crop_size", "size") if processor.get("do_center_crop") else ("size", "crop_size")
    for key in order:
        found = _side_pair(processor.get(key))
        if found is not None:
            return found
    return None


def _side_pair(value: Any) -> tuple[int, int] | None:
    if isinstance(value, int) and value > 0:
        return value, value
    if not isinstance(value, dict):
        return None
    height, width = value.get("height"), value.get("width")
    if isinstance(height, int) and isinstance(width, int) and height > 0 and width > 0:
        return height, width
    edge = value.get("shortest_edge")
    return (edge, edge) if isinstance(edge, int) and edge > 0 else None


def examples(shape: tuple[int, int, int]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The export example and the second example: standard normal pixels (what a normalized image
    looks like), at batch 2 and 1, the same for every export of the same shape."""
    generator = torch.Generator().manual_seed(0)
    first = torch.randn(BATCHES[0], *shape, generator=generator)
    second = torch.randn(BATCHES[1], *shape, generator=generator)
    return {"pixel_values": first}, {"pixel_values": second}


def vision_attrs(folder: Path, task: str, shape: tuple[int, int, int]) -> dict[str, Any]:
    """What the exported model's artifact says of its input: the task, the image shape and where the
    image processor is (for data sources that read images through it)."""
    attrs: dict[str, Any] = {"task": task, "image_shape": list(shape)}
    if (folder / PROCESSOR_FILE).is_file():
        attrs["image_processor"] = str(folder)
    return attrs
