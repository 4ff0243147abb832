"""A text file, one sample per line, tokenized with a Hugging Face tokenizer into padded arrays.

The tokenizer options and the tokenizing are shared with the tabular sources (``_tokenize``), which
import transformers only when a dataset is loaded: the engine imports this module to read
``Config`` when it validates a workflow, and ``engine --help`` must stay fast.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from engine.core.data import Dataset, DataSource
from engine.core.errors import InputError
from engine.core.refs import FilePath
from evaluators.data._tokenize import TOKENIZER_FILES, TokenizedConfig, source_error, tokenize

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact
    from engine.core.target import TensorSpec

logger = logging.getLogger(__name__)

__all__ = ["TOKENIZER_FILES", "TextLines"]


def _error(where: str, message: str, *, given: str | None = None, expected: str | None = None, hint: str | None = None) -> InputError:
    return source_error("text_lines", where, message, given=given, expected=expected, hint=hint)


class TextLines(DataSource):
    name = "text_lines"
    summary = "One sample per line of a UTF-8 text file, tokenized with the input model's (or a given) Hugging Face tokenizer."
    version = "1"
    libraries = ("transformers", "tokenizers")

    class Config(TokenizedConfig):
        source: Literal["text_lines"] = Field(description="Reads one sample per line of a text file.")
        path: FilePath = Field(
            description="The text file (UTF-8, one sample per line); relative paths are taken from the workflow's folder."
        )
        limit: int | None = Field(
            default=None, ge=1, description="Keep only the first N samples (after blank lines are skipped). Omit for all."
        )
        skip_blank: bool = Field(default=True, description="Ignore lines that are empty or only whitespace.")

    config: Config

    def read_lines(self) -> list[str]:
        path = Path(self.config.path)
        if not path.is_file():
            raise _error(
                "path",
                "the text file does not exist" if not path.exists() else "the path is not a file",
                given=str(path),
                hint="check the path (relative paths are taken from the workflow's folder)",
            )
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise _error("path", f"the file is not UTF-8 text ({error})", given=str(path)) from error
        lines = [line.strip() for line in text.splitlines()]
        if self.config.skip_blank:
            lines = [line for line in lines if line]
        if self.config.limit is not None:
            lines = lines[: self.config.limit]
        if not lines:
            why = "the file is empty" if not text else "the file holds only blank lines"
            raise _error("path", f"{why}: no samples to read", given=str(path), hint="put one sample per line")
        return lines

    def load(self, input_model: ModelArtifact | None, signature: list[TensorSpec] | None = None) -> Dataset:
        lines = self.read_lines()
        cfg = self.config
        inputs, tokenized = tokenize(self.name, lines, cfg, input_model, str(cfg.path))
        logger.debug("text_lines: %d samples of %d tokens from %s", len(lines), tokenized["sequence_length"], cfg.path)
        meta = {"source": self.name, "path": str(cfg.path), "samples": len(lines), **tokenized, "inputs": sorted(inputs)}
        return Dataset(inputs=inputs, meta=meta)
