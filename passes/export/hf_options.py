"""The options of a Hugging Face source, defined once for the passes that load one (torch_export,
openvino_convert). Each pass keeps its own default attention implementation: eager where
onnxruntime's attention fusion follows, sdpa for OpenVINO. Light: no torch import."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from engine.core.refs import InputTask

#: filled from the workflow input's ``task`` when the step does not set it
Task = InputTask[Literal["feature-extraction", "text-classification", "image-classification", "object-detection", "semantic-segmentation"]]
AttnImplementation = Literal["eager", "sdpa"]


def task_field(scope: str) -> Any:
    """``task``; ``scope`` opens the description (e.g. "Hugging Face input only")."""
    return Field(
        default="feature-extraction",
        description=f"{scope}: the transformers class the model is loaded with: feature-extraction AutoModel (text or vision "
        "encoders), text-classification AutoModelForSequenceClassification, image-classification AutoModelForImageClassification, "
        "object-detection AutoModelForObjectDetection, semantic-segmentation AutoModelForSemanticSegmentation. A vision model "
        "takes pixel_values (batch dynamic) of the size its preprocessor_config.json or config.json states.",
    )


def attn_implementation_field(default: AttnImplementation, scope: str, note: str = "") -> Any:
    """``attn_implementation`` with this pass's default; ``note`` ends the description."""
    return Field(
        default=default,
        description=f"{scope}: the attention implementation the Hugging Face model is loaded (and traced) with.{note}",
    )
