"""Extract English prose from the Python Language Reference that ships with CPython
(``pydoc_data.topics``) into the three files beside this script. Run with any Python 3.11:

    python workflows/data/english/extract.py

Paragraphs are kept when they read as prose (most of their characters are letters and spaces,
no grammar rules or code); they are numbered in a fixed order, and every 10th goes to the held-out
set, which the tiny decoder never trains on. The prompts are the first words of held-out paragraphs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pydoc_data.topics as topics

HERE = Path(__file__).parent


def paragraphs() -> list[str]:
    out: list[str] = []
    for key in sorted(topics.topics):
        for block in re.split(r"\n\s*\n", topics.topics[key]):
            lines = block.split("\n")
            if any(line.startswith((" ", "*", "=", "-", ">>>")) for line in lines):
                continue  # code, grammar, lists, headings' underlines
            text = " ".join(line.strip() for line in lines).replace('"', "")
            letters = sum(ch.isalpha() or ch == " " for ch in text)
            if len(text) >= 120 and letters / len(text) > 0.93:
                out.append(text)
    return out


def main() -> None:
    train, heldout = [], []
    for i, text in enumerate(paragraphs()):
        (heldout if i % 10 == 9 else train).append(text)
    (HERE / "train.txt").write_text("\n".join(train) + "\n")
    (HERE / "heldout.txt").write_text("\n".join(heldout) + "\n")
    prompts = [" ".join(text.split()[:8]) for text in heldout[:24]]
    (HERE / "prompts.txt").write_text("\n".join(prompts) + "\n")


if __name__ == "__main__":
    main()
