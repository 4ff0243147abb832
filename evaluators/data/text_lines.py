"""A text file, one sample per line, tokenized with a Hugging Face tokenizer into padded arrays.

transformers is imported inside ``load``, never at module import: the engine imports this module
to read ``Config`` when it validates a workflow, and ``engine --help`` must stay fast.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from engine.core.data import Dataset, DataSource, DataSourceConfig
from engine.core.errors import InputError, MissingDependency, Problem

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact
    from engine.core.target import TensorSpec

logger = logging.getLogger(__name__)

#: files of which a tokenizer folder must hold at least one
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)


def _error(where: str, message: str, *, given: str | None = None, expected: str | None = None, hint: str | None = None) -> InputError:
    return InputError([Problem(where=f"text_lines.{where}", message=message, given=given, expected=expected, hint=hint)])


class TextLines(DataSource):
    name = "text_lines"
    summary = "One sample per line of a UTF-8 text file, tokenized with the input model's (or a given) Hugging Face tokenizer."
    version = "1"
    libraries = ("transformers", "tokenizers")
    path_options = ("path", "tokenizer")
    path_sentinels = ("input",)

    class Config(DataSourceConfig):
        source: Literal["text_lines"] = Field(description="Reads one sample per line of a text file.")
        path: str = Field(description="The text file (UTF-8, one sample per line); relative paths are taken from the workflow's folder.")
        tokenizer: str = Field(
            default="input",
            description="`input` for the tokenizer saved with the workflow's input model (a Hugging Face folder), or a folder holding a Hugging Face tokenizer.",
        )
        max_length: int = Field(
            default=128, ge=1, description="Tokens per sample, special tokens included: longer lines are truncated, shorter ones padded."
        )
        padding: Literal["max_length", "longest"] = Field(
            default="max_length",
            description="`max_length` pads every sample to max_length; `longest` pads to the longest line of the file (at most max_length when truncating).",
        )
        truncation: bool = Field(
            default=True, description="Cut lines longer than max_length. Without it a longer line is an error under `max_length` padding."
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

    def tokenizer_folder(self, input_model: ModelArtifact | None) -> Path:
        if self.config.tokenizer != "input":
            folder = Path(self.config.tokenizer)
        elif input_model is not None and input_model.format == "hf":
            folder = Path(input_model.path)
        elif input_model is not None and input_model.attrs.get("tokenizer"):
            # a model exported elsewhere may carry the folder of the tokenizer it was made with
            folder = Path(input_model.attrs["tokenizer"])
        else:
            given = "no input model" if input_model is None else f"a {input_model.format} input model"
            raise _error(
                "tokenizer",
                "`tokenizer: input` needs the workflow's input model to be a Hugging Face folder that holds its tokenizer",
                given=given,
                hint="set `tokenizer:` to a folder holding a Hugging Face tokenizer",
            )
        if not folder.is_dir():
            raise _error("tokenizer", "the tokenizer folder does not exist", given=str(folder))
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            raise _error(
                "tokenizer",
                "the folder holds no tokenizer files",
                given=str(folder),
                expected=f"at least one of {', '.join(TOKENIZER_FILES)}",
                hint="save one with tokenizer.save_pretrained(folder)",
            )
        return folder

    def _tokenizer(self, folder: Path) -> Any:
        # Nothing is ever downloaded: the hub is switched off before transformers loads anything.
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        try:
            from transformers import AutoTokenizer
        except ImportError as error:
            raise MissingDependency("transformers", "the text_lines data source") from error
        try:
            return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise _error("tokenizer", f"transformers could not load a tokenizer from the folder: {error}", given=str(folder)) from error

    def load(self, input_model: ModelArtifact | None, signature: list[TensorSpec] | None = None) -> Dataset:
        import numpy as np

        lines = self.read_lines()
        folder = self.tokenizer_folder(input_model)
        tokenizer = self._tokenizer(folder)
        cfg = self.config
        lengths = [len(ids) for ids in tokenizer(lines, truncation=False, padding=False)["input_ids"]]
        too_long = [index for index, length in enumerate(lengths) if length > cfg.max_length]
        if too_long and not cfg.truncation and cfg.padding == "max_length":
            first = too_long[0]
            raise _error(
                "max_length",
                f"{len(too_long)} line(s) have more than max_length={cfg.max_length} tokens (sample {first + 1} has {lengths[first]}) and truncation is off",
                given=str(cfg.path),
                hint="set truncation: true, raise max_length, or use padding: longest",
            )
        encoded = tokenizer(
            lines,
            padding=cfg.padding,
            truncation=cfg.truncation,
            max_length=cfg.max_length if (cfg.truncation or cfg.padding == "max_length") else None,
        )
        inputs = {name: np.asarray(values, dtype=np.int64) for name, values in encoded.items()}
        sequence_length = int(next(iter(inputs.values())).shape[1])
        logger.debug("text_lines: %d samples of %d tokens from %s", len(lines), sequence_length, cfg.path)
        meta = {
            "source": self.name,
            "path": str(cfg.path),
            "samples": len(lines),
            "sequence_length": sequence_length,
            "tokenizer": str(folder),
            "tokenizer_class": type(tokenizer).__name__,
            "padding": cfg.padding,
            "max_length": cfg.max_length,
            "truncated_samples": len(too_long) if cfg.truncation else 0,
            "inputs": sorted(inputs),
        }
        return Dataset(inputs=inputs, meta=meta)
