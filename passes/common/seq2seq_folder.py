"""The ``seq2seq`` folder on the pass side: its manifest (``seq2seq.json``), its parts saved
reproducibly, the output check, and the parts a pass that works per ONNX file (``ort_quantize``)
applies itself to. The runtime reads the same manifest (``targets.onnxruntime.seq2seq``).

Imports nothing heavy at module level: the engine imports pass modules to validate workflows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from passes.common.onnx_io import SEQ2SEQ_FORMAT, SEQ2SEQ_MANIFEST, SEQ2SEQ_PARTS, OnnxPass, clamp_ir_version, seq2seq_parts

MANIFEST, PARTS, FORMAT = SEQ2SEQ_MANIFEST, SEQ2SEQ_PARTS, SEQ2SEQ_FORMAT
__all__ = ["FORMAT", "MANIFEST", "PARTS", "Seq2SeqPass", "manifest", "save_part", "seq2seq_parts"]


def save_part(exported: Path, out: Path, part: str) -> str:
    """The exported ``part`` as ``out/<part>.onnx``: reproducible (no exporter names, stamps or
    stack traces), loadable by the installed onnxruntime, its weights in ``<part>.onnx.data``."""
    import onnx

    from passes.export.exporters import make_reproducible

    proto = onnx.load(str(exported))
    make_reproducible(proto)
    clamp_ir_version(proto)
    name = f"{part}.onnx"
    onnx.save_model(
        proto, str(out / name), save_as_external_data=True, all_tensors_to_one_file=True, location=f"{name}.data", size_threshold=1024
    )
    return name


def manifest(
    lm: Any, task: str, layers: int, start: int, files: dict[str, str], names: dict[str, tuple[list[str], list[str]]]
) -> dict[str, Any]:
    """seq2seq.json for an exported model: the parts with their inputs and outputs, the tokens."""
    config = lm.config
    generation = getattr(lm, "generation_config", None)

    def token(name: str) -> Any:
        value = getattr(generation, name, None) if generation is not None else None
        return value if value is not None else getattr(config, name, None)

    document: dict[str, Any] = {
        "task": task,
        "model_type": str(config.model_type),
        "layers": layers,
        "vocab_size": int(config.vocab_size),
        "decoder_start_token_id": start,
        "eos_token_id": token("eos_token_id"),
        "pad_token_id": token("pad_token_id"),
        "past_present_share_buffer": False,
    }
    for part in PARTS:
        document[part] = {"filename": files[part], "inputs": names[part][0], "outputs": names[part][1]}
    if task == "automatic-speech-recognition":
        document["input_features"] = [int(config.num_mel_bins), 2 * int(config.max_source_positions)]
    return document


class Seq2SeqPass(OnnxPass):
    """Base of passes that write a ``seq2seq`` folder: each part checked as an ONNX model is
    (``OnnxPass.check_output``)."""

    produces = FORMAT
