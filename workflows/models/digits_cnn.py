"""A small CNN for scikit-learn's 8x8 digits, trained deterministically in a few seconds.

``build()`` is the factory the digits workflow names: it trains on the first 1,200 digits (the
workflow evaluates on the last 597, which training never sees) and returns the trained module
with an example input. Same code, same library versions → same weights, bit for bit (one thread,
fixed seed, deterministic algorithms).
"""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from torch import nn

TRAIN_SAMPLES = 1200


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - the ONNX input's name
        return self.classifier(self.features(input))


def build(epochs: int = 12, seed: int = 0) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    digits = load_digits()
    images = torch.tensor(digits.images[:TRAIN_SAMPLES] / 16.0, dtype=torch.float32).unsqueeze(1)
    labels = torch.tensor(digits.target[:TRAIN_SAMPLES], dtype=torch.long)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        model = DigitsCNN()
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        loss_fn = nn.CrossEntropyLoss()
        for _ in range(epochs):
            order = torch.randperm(len(images), generator=generator)
            for start in range(0, len(images), 64):
                batch = order[start : start + 64]
                optimizer.zero_grad()
                loss_fn(model(images[batch]), labels[batch]).backward()
                optimizer.step()
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(threads)
    model.eval()
    return model, {"input": images[:1]}
