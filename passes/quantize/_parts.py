"""``ort_quantize`` over a ``seq2seq`` folder: each ONNX model seq2seq.json names (the encoder and
the decoder with past) quantized on its own as a one-model ONNX folder, saved back under its own
name; seq2seq.json, config.json and the tokenizer's files copied as they are.

Dynamic mode only: static mode would need calibration feeds for the decoder's cache inputs, which
a workflow dataset of sources does not hold.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

from engine.core import KilnError, ModelArtifact, PassContext, PassResult
from passes.common.onnx_io import save_onnx
from passes.common.seq2seq_folder import FORMAT, save_part, seq2seq_parts


def quantize_parts(pass_: Any, model: ModelArtifact, ctx: PassContext) -> PassResult:
    """Run ``pass_`` (an ``OrtQuantize``) on each part of the seq2seq folder ``model``."""
    import onnx

    if pass_.config.mode != "dynamic":
        raise KilnError(
            f"{pass_.name} quantizes a {FORMAT} folder (encoder + decoder with past) in dynamic mode only, not {pass_.config.mode!r}: "
            "static calibration would need the decoder's cache inputs; set mode: dynamic"
        )
    source, out = Path(model.path), Path(ctx.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = seq2seq_parts(source)
    details: dict[str, Any] = {}
    notes: list[str] = []
    for name in names:
        part = name.removesuffix(".onnx")
        root = Path(ctx.workdir) / "parts" / part
        shutil.rmtree(root, ignore_errors=True)
        save_onnx(onnx.load(str(source / name)), root / "input")  # its weights read in, saved with the model
        (root / "work").mkdir(parents=True)
        sub = dataclasses.replace(ctx, workdir=root / "work", output_dir=root / "output")
        result = pass_.run(ModelArtifact.from_folder("onnx", root / "input"), sub)
        save_part(result.model.model_file, out, part)
        details[part] = result.details
        notes += [f"{part}: {note}" for note in result.notes]
    written = set(names) | {f"{name}.data" for name in names}
    copied = []
    for item in sorted(source.iterdir()):
        if item.is_file() and item.name not in written:
            shutil.copyfile(item, out / item.name)
            copied.append(item.name)
    summary = {
        "mode": pass_.config.mode,
        "parts": names,
        "quantized_ops": {part: info.get("quantized_ops") for part, info in details.items()},
        "copied": copied,
        "per_part": details,
    }
    return PassResult(model=ModelArtifact.from_folder(FORMAT, out, attrs=model.attrs), details=summary, notes=notes)
