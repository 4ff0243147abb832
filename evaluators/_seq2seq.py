"""Helpers of the evaluators that measure encoder-decoder models (``seq2seq_fidelity``,
``seq2seq_generation``): the sources a model is run on, its session opened and called with
failures told as ``EvaluationError``, and PyTorch's greedy tokens for the same sources.

A source is one encoder input of batch 1: ``input_ids`` + ``attention_mask`` (a text model; a
dataset row's tokens where its mask is 1) or ``input_features`` ``[1, num_mel_bins, frames]`` (an
audio model). Without a dataset the sources are synthetic and seeded: random token ids, or random
log-mel features of the shape the encoder takes, so a folder without tokenizer files works.
numpy is imported inside functions: evaluator modules import this one at validate time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.errors import EvaluationError
from engine.core.target import Generation, Seq2SeqSession
from evaluators._sessions import RUN_ERRORS, dataset, open_session

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact
    from engine.core.evaluator import EvalContext
    from engine.core.target import Target

FORMAT = "seq2seq"
MANIFEST = "seq2seq.json"
#: tokens of a synthetic text source; ids below FIRST_ID are left out (pad, start, end)
SYNTHETIC_LENGTH, FIRST_ID = 12, 3


def manifest(model: ModelArtifact, evaluator: str) -> dict[str, Any]:
    if model.format != FORMAT:
        raise EvaluationError(f"the {evaluator} evaluator needs an encoder-decoder model ({FORMAT} format); got {model.format}")
    path = Path(model.path) / MANIFEST
    try:
        document: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise EvaluationError(f"cannot read {path}: {error}") from error
    return document


def sources(ctx: EvalContext, model: ModelArtifact, data: str | None, count: int, evaluator: str) -> list[dict[str, np.ndarray]]:
    """``count`` sources (at most; every row of ``data`` when it has fewer) for ``model``."""
    import numpy as np

    document = manifest(model, evaluator)
    audio = "input_features" in document
    if data is None:
        rng = np.random.default_rng(0)
        if audio:
            mel, frames = (int(v) for v in document["input_features"])
            return [{"input_features": rng.standard_normal((1, mel, frames)).astype(np.float32)} for _ in range(count)]
        vocab = int(document["vocab_size"])
        rows = rng.integers(min(FIRST_ID, vocab - 1), vocab, (count, SYNTHETIC_LENGTH))
        return [{"input_ids": row[None, :].astype(np.int64), "attention_mask": np.ones((1, len(row)), np.int64)} for row in rows]
    inputs = dataset(ctx, data).inputs
    wanted = "input_features" if audio else "input_ids"
    if wanted not in inputs:
        raise EvaluationError(
            f"the {evaluator} evaluator reads {wanted} from dataset '{data}' for this {document.get('task')} model; "
            f"it has: {', '.join(sorted(inputs)) or 'nothing'}"
        )
    if audio:
        features = np.asarray(inputs["input_features"], dtype=np.float32)
        return [{"input_features": row[None]} for row in features[:count]]
    ids = np.asarray(inputs["input_ids"])
    mask = np.asarray(inputs["attention_mask"]) if "attention_mask" in inputs else np.ones_like(ids)
    found = []
    for row, keep in zip(ids[:count], mask[:count], strict=True):
        tokens = row[keep == 1].astype(np.int64)
        if len(tokens):
            found.append({"input_ids": tokens[None, :], "attention_mask": np.ones((1, len(tokens)), np.int64)})
    if not found:
        raise EvaluationError(f"dataset '{data}' has no row with tokens")
    return found


def open_seq2seq(ctx: EvalContext, model: ModelArtifact, role: str, evaluator: str, target: Target | None = None) -> Seq2SeqSession:
    target = target if target is not None else ctx.target
    session = open_session(ctx, model, role, target=target)
    if not isinstance(session, Seq2SeqSession):
        session.close()
        raise EvaluationError(
            f"target '{target.id}' ({target.runtime}) opened the {role} as a plain session; the {evaluator} evaluator needs a target "
            "that runs encoder-decoder models with a key/value cache (onnxruntime)"
        )
    return session


def generate(session: Seq2SeqSession, source: dict[str, np.ndarray], max_new_tokens: int, role: str) -> Generation:
    try:
        return session.generate_from(source, max_new_tokens)
    except RUN_ERRORS as error:
        raise EvaluationError(f"generating with the {role} failed: {error}") from error


def first_logits(session: Seq2SeqSession, source: dict[str, np.ndarray], role: str) -> np.ndarray:
    import numpy as np

    try:
        out = np.asarray(session.first_logits(source))
    except RUN_ERRORS as error:
        raise EvaluationError(f"the {role}'s first decoder step failed: {error}") from error
    if not np.isfinite(out).all():
        raise EvaluationError(f"the {role}'s first-step logits hold NaN or infinite values")
    return out


def torch_tokens(folder: Path, document: dict[str, Any], found: list[dict[str, np.ndarray]], max_new_tokens: int) -> list[list[int]]:
    """PyTorch's ``generate(do_sample=False)`` on each source, up to ``max_new_tokens`` new tokens
    (fewer when an end token comes: it is kept), the start token left out. The generation config
    is greedy and bare (the model's start, end and pad tokens; no forced or suppressed tokens, no
    repeat rules, one beam), as Kiln's loop is; Whisper's own ``generate``, which adds language and
    task tokens, is bypassed for the library's general one."""
    import torch
    import transformers

    if not (Path(folder) / "config.json").is_file():
        raise EvaluationError(f"PyTorch's tokens need the Hugging Face folder the model was exported from; {folder} has no config.json")
    task = document.get("task")
    auto = transformers.AutoModelForSpeechSeq2Seq if task == "automatic-speech-recognition" else transformers.AutoModelForSeq2SeqLM
    model = auto.from_pretrained(str(folder), dtype=torch.float32, local_files_only=True).eval()
    config = transformers.GenerationConfig(
        decoder_start_token_id=document["decoder_start_token_id"],
        eos_token_id=document.get("eos_token_id"),
        pad_token_id=document.get("pad_token_id"),
        do_sample=False,
        num_beams=1,
        max_new_tokens=max_new_tokens,
    )
    out = []
    with torch.no_grad():
        for source in found:
            feeds = {name: torch.from_numpy(array) for name, array in source.items()}
            ids = transformers.GenerationMixin.generate(model, **feeds, generation_config=config)
            out.append([int(t) for t in ids[0, 1:]])
    return out
