"""Olive's side of bench/vs_olive.py: the sentences of workflows/data/sentences.txt as an Olive
dataset (NNCF calibration and the latency batch), and the example input OpenVINOConversion needs
to trace the Hugging Face model. Runs inside Olive's environment, imported by Olive."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from olive.data.registry import Registry

MAX_LENGTH = 128


def _tokenizer(model_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


class SentenceDataset(torch.utils.data.Dataset):  # type: ignore[misc]
    """Lines ``start`` .. ``start + count`` of a text file, tokenized and padded to 128 tokens;
    each item is (inputs, dummy label) as Olive's dataloaders expect."""

    def __init__(self, path: str, model_path: str, start: int = 0, count: int = 32) -> None:
        lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
        encoded = _tokenizer(model_path)(
            lines[start : start + count], padding="max_length", truncation=True, max_length=MAX_LENGTH, return_tensors="pt"
        )
        self.items = [{name: encoded[name][i] for name in encoded} for i in range(len(encoded["input_ids"]))]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index], torch.tensor(0)


@Registry.register_dataset()
def kiln_sentences(path: str, model_path: str, start: int = 0, count: int = 32) -> SentenceDataset:
    return SentenceDataset(path, model_path, start, count)


def example_input():
    """One tokenized line at batch 1, 128 tokens (the latency shape)."""
    item = SentenceDataset(os.environ["KILN_BENCH_SENTENCES"], os.environ["KILN_BENCH_MODEL"], 0, 1)[0][0]
    return {name: tensor.unsqueeze(0) for name, tensor in item.items()}
