"""Tiny Hugging Face vision models for tests: a transformers config with two stages (or layers),
a small width and 32x32 images, random weights, saved with save_pretrained beside an image
processor config (preprocessor_config.json) as the Hub's checkpoints hold one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: the image side every tiny model takes
SIDE = 32
LABELS = 3
#: family -> (config class, model class, config options)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "vit": (
        "ViTConfig",
        "ViTForImageClassification",
        {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "image_size": SIDE, "patch_size": 8},
    ),
    "resnet": ("ResNetConfig", "ResNetForImageClassification", {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1]}),
    "convnext": ("ConvNextConfig", "ConvNextForImageClassification", {"num_stages": 2, "hidden_sizes": [8, 16], "depths": [1, 1]}),
    "swin": (
        "SwinConfig",
        "SwinForImageClassification",
        {"image_size": SIDE, "patch_size": 4, "embed_dim": 8, "depths": [1, 1], "num_heads": [1, 2], "window_size": 4},
    ),
    "mobilenet_v2": ("MobileNetV2Config", "MobileNetV2ForImageClassification", {"image_size": SIDE, "depth_multiplier": 0.25}),
    "deit": (
        "DeiTConfig",
        "DeiTForImageClassification",
        {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "image_size": SIDE, "patch_size": 8},
    ),
    "regnet": (
        "RegNetConfig",
        "RegNetForImageClassification",
        {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1], "groups_width": 8},
    ),
    "dinov2": (
        "Dinov2Config",
        "Dinov2ForImageClassification",
        {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "mlp_ratio": 2, "image_size": SIDE, "patch_size": 8},
    ),
    "beit": (
        "BeitConfig",
        "BeitForImageClassification",
        {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "image_size": SIDE, "patch_size": 8},
    ),
}
#: detection and segmentation heads: name -> (config class, model class, task, config options)
TASK_MODELS: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "segformer": (
        "SegformerConfig",
        "SegformerForSemanticSegmentation",
        "semantic-segmentation",
        {
            "num_encoder_blocks": 2,
            "depths": [1, 1],
            "sr_ratios": [2, 1],
            "hidden_sizes": [8, 16],
            "num_attention_heads": [1, 2],
            "decoder_hidden_size": 16,
            "patch_sizes": [7, 3],
            "strides": [4, 2],
            "mlp_ratios": [2, 2],
        },
    ),
    "yolos": (
        "YolosConfig",
        "YolosForObjectDetection",
        "object-detection",
        {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "image_size": [SIDE, SIDE],
            "patch_size": 8,
            "num_detection_tokens": 5,
        },
    ),
    "detr": (
        "DetrConfig",
        "DetrForObjectDetection",
        "object-detection",
        {
            "use_timm_backbone": False,
            "use_pretrained_backbone": False,
            "d_model": 16,
            "encoder_layers": 1,
            "decoder_layers": 1,
            "encoder_attention_heads": 2,
            "decoder_attention_heads": 2,
            "encoder_ffn_dim": 32,
            "decoder_ffn_dim": 32,
            "num_queries": 5,
        },
    ),
}
#: families saved without an image processor: the export reads the size from config.json
NO_PROCESSOR = ("swin",)


def processor_config(side: int = SIDE) -> dict[str, Any]:
    """A ViT image processor: resize to side x side, rescale to [0, 1], normalize with 0.5 / 0.5."""
    return {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True,
        "size": {"height": side, "width": side},
        "resample": 2,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }


def config(family: str, **extra: Any) -> Any:
    import transformers

    config_class, _, options = FAMILIES[family]
    return getattr(transformers, config_class)(**{**options, "num_labels": LABELS, **extra})


def tiny_vision(folder: Path, family: str = "vit", model_class: str | None = None, seed: int = 0, processor: bool | None = None) -> Path:
    """Write a tiny random ``family`` model (its classification head unless ``model_class`` names
    another class, e.g. ViTModel) into ``folder``; returns it."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cls = getattr(transformers, model_class or FAMILIES[family][1])
    cls(config(family)).eval().save_pretrained(folder)
    if processor if processor is not None else family not in NO_PROCESSOR:
        (folder / "preprocessor_config.json").write_text(json.dumps(processor_config(), indent=2))
    return folder


def write_images(root: Path, classes: int = 2, per_class: int = 3, seed: int = 0) -> Path:
    """PNG and JPEG images of random sizes, one sub-folder per class; returns ``root``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for label in range(classes):
        folder = root / f"class{label}"
        folder.mkdir(parents=True)
        for index in range(per_class):
            height, width = (int(v) for v in rng.integers(20, 60, size=2))
            pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"img{index}.{'png' if index % 2 == 0 else 'jpg'}")
    return root


def tiny_task_model(folder: Path, name: str, seed: int = 0) -> tuple[Path, str]:
    """Write a tiny random detection or segmentation model ``name`` of TASK_MODELS; (folder, task)."""
    import torch
    import transformers

    config_class, model_class, task, options = TASK_MODELS[name]
    extra: dict[str, Any] = {"num_labels": LABELS}
    if name == "detr":  # a transformers ResNet backbone: no timm
        backbone = {"embedding_size": 8, "hidden_sizes": [8, 16, 16, 16], "depths": [1, 1, 1, 1], "out_features": ["stage4"]}
        extra["backbone_config"] = transformers.ResNetConfig(**backbone)
    torch.manual_seed(seed)
    getattr(transformers, model_class)(getattr(transformers, config_class)(**options, **extra)).eval().save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(processor_config()))
    return folder, task
