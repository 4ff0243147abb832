"""The task of a Hugging Face model, read from its config.json's ``architectures``.

The names are optimum's (``optimum.exporters.tasks.TasksManager``): optimum infers a task by finding
the model's class among the classes each of transformers' ``AutoModelFor<Task>`` loads
(``TasksManager._TRANSFORMERS_TASKS_TO_MODEL_LOADERS``). Doing that needs transformers (and torch)
imported; ``engine validate`` reads config.json alone, so the same mapping is replicated here by
the naming rule transformers' classes follow: the head a class name ends with says which
``AutoModelFor<Task>`` loads it (``ViTForImageClassification`` → AutoModelForImageClassification →
``image-classification``). Where one head serves several tasks (``ForConditionalGeneration``:
seq2seq text, speech recognition, image to text; ``ForSequenceClassification`` on audio models),
the config's ``model_type`` decides, as optimum's per-family task lists do.

Light: no import beyond the standard library.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: the head a class name ends with → the task, as optimum names it (the AutoModelFor<...> that loads it)
SUFFIX_TASKS: tuple[tuple[str, str], ...] = (
    ("ForImageClassificationWithTeacher", "image-classification"),  # DeiT distilled
    ("ForImageClassification", "image-classification"),
    ("ForObjectDetection", "object-detection"),
    ("ForSemanticSegmentation", "semantic-segmentation"),
    ("ForInstanceSegmentation", "image-segmentation"),
    ("ForUniversalSegmentation", "image-segmentation"),
    ("ForSegmentation", "image-segmentation"),  # DetrForSegmentation
    ("ForMaskedImageModeling", "masked-im"),
    ("ForDepthEstimation", "depth-estimation"),
    ("ForCausalLM", "text-generation"),
    ("LMHeadModel", "text-generation"),  # GPT2LMHeadModel, BertLMHeadModel
    ("ForSpeechSeq2Seq", "automatic-speech-recognition"),
    ("ForCTC", "automatic-speech-recognition"),
    ("ForAudioClassification", "audio-classification"),
    ("ForAudioFrameClassification", "audio-frame-classification"),
    ("ForXVector", "audio-xvector"),
    ("ForSequenceClassification", "text-classification"),
    ("ForTokenClassification", "token-classification"),
    ("ForQuestionAnswering", "question-answering"),
    ("ForMultipleChoice", "multiple-choice"),
    ("ForMaskedLM", "fill-mask"),
    ("ForZeroShotImageClassification", "zero-shot-image-classification"),
)
#: ``...ForConditionalGeneration`` by model_type: speech recognition, image to text; text2text otherwise
SPEECH_TYPES = frozenset({"whisper", "speech_to_text", "speech-encoder-decoder", "moonshine", "seamless_m4t"})
IMAGE_TO_TEXT_TYPES = frozenset(
    {"blip", "blip-2", "pix2struct", "vision-encoder-decoder", "llava", "paligemma", "idefics2", "kosmos-2", "git", "florence2"}
)
#: audio encoders whose ``...ForSequenceClassification`` classifies audio (AutoModelForAudioClassification)
AUDIO_TYPES = frozenset(
    {"wav2vec2", "wav2vec2-conformer", "hubert", "wavlm", "data2vec-audio", "unispeech", "unispeech-sat", "sew", "sew-d", "whisper"}
)
#: whole models that are not ``...Model`` backbones, by class name
WHOLE_MODELS = {
    "EncoderDecoderModel": "text2text-generation",
    "SpeechEncoderDecoderModel": "automatic-speech-recognition",
    "VisionEncoderDecoderModel": "image-to-text",
    "CLIPModel": "zero-shot-image-classification",
    "SiglipModel": "zero-shot-image-classification",
}


def task_of_architecture(architecture: str, model_type: str | None = None) -> str | None:
    """The task of one transformers model class (``BertModel`` → feature-extraction), or None when
    the name follows none of transformers' head names (a class of remote code, a pretraining head)."""
    if architecture in WHOLE_MODELS:
        return WHOLE_MODELS[architecture]
    if architecture.endswith("ForConditionalGeneration"):
        if model_type in SPEECH_TYPES:
            return "automatic-speech-recognition"
        if model_type in IMAGE_TO_TEXT_TYPES:
            return "image-to-text"
        return "text2text-generation"
    for suffix, task in SUFFIX_TASKS:
        if architecture.endswith(suffix):
            if task == "text-classification" and model_type in AUDIO_TYPES:
                return "audio-classification"
            return task
    if architecture.endswith("Model") and not architecture.endswith("PreTrainedModel"):
        return "feature-extraction"  # the bare backbone: AutoModel
    return None


def task_of_config(config: Any) -> tuple[str | None, str | None]:
    """(task, architecture it was read from) for a parsed config.json: its first architecture, as
    optimum and transformers' pipelines take it; (None, None) when it names none Kiln can read."""
    if not isinstance(config, dict):
        return None, None
    listed = config.get("architectures")
    if not isinstance(listed, list) or not listed or not isinstance(listed[0], str):
        return None, None
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    task = task_of_architecture(listed[0], model_type)
    return (task, listed[0]) if task else (None, None)


#: config.json files larger than this are not read to infer a task (a config is a few kilobytes)
MAX_CONFIG_BYTES = 4 << 20


def infer_task(folder: Path) -> tuple[str | None, str | None]:
    """(task, architecture) from ``folder/config.json``; (None, None) when it is missing, unreadable
    or names no architecture Kiln can read (the caller then keeps its default)."""
    try:
        text = (folder / "config.json").read_bytes()[:MAX_CONFIG_BYTES]
        config = json.loads(text)
    except (OSError, ValueError, RecursionError):
        return None, None
    return task_of_config(config)
