"""Contexts for the decoder evaluators' tests: bigram models (``_fakes.BigramSession``), a
dataset of token rows with padding, and an ``EvalContext`` on the bigram target."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from _fakes import BigramTarget

from engine.core.artifact import ModelArtifact
from engine.core.data import Dataset
from engine.core.evaluator import EvalContext
from engine.core.target import TargetConfig

VOCAB = 12


def rows_dataset(lengths: tuple[int, ...] = (6, 4, 1, 7), width: int = 8, seed: int = 5) -> Dataset:
    """Token rows padded on the right (pad id 0, mask 0) to ``width``."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(1, VOCAB, size=length)
        mask[row, :length] = 1
    return Dataset(inputs={"input_ids": ids, "attention_mask": mask})


def tokens_of(data: Dataset) -> list[list[int]]:
    ids, mask = data.inputs["input_ids"], data.inputs["attention_mask"]
    return [[int(t) for t in row[m == 1]] for row, m in zip(ids, mask, strict=True)]


def context(
    workdir: Path, reference: ModelArtifact | None, data: Dataset, *, cache: bool = False, plain: bool = False
) -> tuple[EvalContext, BigramTarget]:
    target = BigramTarget(TargetConfig(id="bigram", runtime="bigram"), plain=plain)
    ctx = EvalContext(
        target=target,
        workdir=workdir,
        reference=reference,
        datasets={"text": lambda: data},
        cache_dir=workdir / "cache" if cache else None,
    )
    return ctx, target
