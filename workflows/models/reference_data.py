"""Datasets of ``workflows/llm-reference-cpu.yaml`` (``source: custom``): token rows of the
reference decoder's corpus, tokenized with its tokenizer, right-padded with an attention mask.

- ``heldout``: windows of the held-out documents (never trained on), spread over them;
- ``prompts``: the first tokens of held-out documents;
- ``calibration``: windows of the train split at seeded offsets (GPTQ's calibration text).

Each builds (or finds in the cache) the model of ``recipe`` first: its corpus and tokenizer are
the model's own.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import reference_decoder as rd


def _rows(rows: list[list[int]], pad: int) -> dict[str, Any]:
    import numpy as np

    width = max(map(len, rows))
    ids = np.full((len(rows), width), pad, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = row
        mask[index, : len(row)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def _tokenizer(folder: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(folder)


def heldout(_model: str | None, recipe: str = "full", windows: int = 64) -> dict[str, Any]:
    folder = rd.build(recipe)
    docs, _ = rd.heldout_tokens(folder, recipe)
    rows, _ = rd.heldout_windows(docs, rd.RECIPES[recipe].sequence, windows)
    return _rows(rows, _tokenizer(folder).eos_token_id)


def prompts(_model: str | None, recipe: str = "full", count: int = 8, length: int = 24) -> dict[str, Any]:
    folder = rd.build(recipe)
    docs, _ = rd.heldout_tokens(folder, recipe)
    return _rows([doc[:length] for doc in docs if len(doc) >= length][:count], _tokenizer(folder).eos_token_id)


def calibration(_model: str | None, recipe: str = "full", count: int = 128, seed: int = 0) -> dict[str, Any]:
    import torch

    folder = rd.build(recipe)
    spec = rd.RECIPES[recipe]
    tok = _tokenizer(folder)
    stream = [t for doc in rd.encode(tok, rd.build_corpus(spec.corpus).train) for t in doc]
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - spec.sequence, (count,), generator=generator).tolist()
    return _rows([stream[s : s + spec.sequence] for s in starts], tok.eos_token_id)
