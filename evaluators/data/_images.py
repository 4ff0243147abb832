"""Images prepared by a Hugging Face image processor (transformers' AutoImageProcessor): resized,
cropped, rescaled and normalized exactly as the model was trained on them.

transformers and Pillow are imported inside the functions: the engine imports the data sources to
read their ``Config`` when it validates a workflow.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.errors import MissingDependency
from evaluators.data._tokenize import source_error

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact

#: the file an image processor's ``save_pretrained`` writes
PROCESSOR_FILE = "preprocessor_config.json"
#: images handed to the processor at once (bounds the memory of the PIL images held)
CHUNK = 64


def processor_folder(source: str, option: str, input_model: ModelArtifact | None) -> Path:
    """The folder of the image processor that ``option`` (a folder, or ``input``) names."""
    if option != "input":
        folder = Path(option)
    elif input_model is not None and input_model.format == "hf":
        folder = Path(input_model.path)
    elif input_model is not None and input_model.attrs.get("image_processor"):
        folder = Path(input_model.attrs["image_processor"])  # an export keeps the folder it was made from
    else:
        given = "no input model" if input_model is None else f"a {input_model.format} input model"
        raise source_error(
            source,
            "processor",
            "`processor: input` needs the workflow's input model to be a Hugging Face folder that holds its image processor",
            given=given,
            hint=f"set `processor:` to a folder holding {PROCESSOR_FILE}",
        )
    if not (folder / PROCESSOR_FILE).is_file():
        raise source_error(
            source,
            "processor",
            f"the folder holds no {PROCESSOR_FILE}",
            given=str(folder),
            hint="save one with AutoImageProcessor.save_pretrained(folder), or set size / mean / std instead of processor",
        )
    return folder


def load_processor(source: str, folder: Path) -> Any:
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is ever downloaded
    try:
        from transformers import AutoImageProcessor
    except ImportError as error:
        raise MissingDependency("transformers", f"the {source} data source's processor") from error
    try:
        return AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, ImportError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise source_error(
            source, "processor", f"transformers could not load an image processor from the folder: {first}", given=str(folder)
        ) from error


def processed(
    source: str, samples: list[tuple[Path, int]], option: str, input_name: str | None, input_model: ModelArtifact | None
) -> tuple[str, np.ndarray]:
    """(input name, float32 pixels of every sample stacked) as the processor prepares them."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    folder = processor_folder(source, option, input_model)
    processor = load_processor(source, folder)
    names = list(getattr(processor, "model_input_names", None) or ["pixel_values"])
    name = input_name or names[0]
    parts = []
    for start in range(0, len(samples), CHUNK):
        images = []
        for file, _ in samples[start : start + CHUNK]:
            try:
                with Image.open(file) as image:
                    images.append(image.convert("RGB"))
            except (UnidentifiedImageError, OSError, ValueError) as error:
                raise source_error(
                    source, "path", f"cannot read image {file}: {error}", given=str(file), hint="remove or replace the file"
                ) from error
        batch = processor(images=images, return_tensors="np")
        parts.append(np.asarray(batch[names[0]], dtype=np.float32))
    return name, np.ascontiguousarray(np.concatenate(parts))
