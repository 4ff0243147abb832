"""Tokenizing text samples with a Hugging Face tokenizer, shared by the text data sources.

transformers is imported inside ``load_tokenizer``, never at module import: the engine imports the
data sources to read their ``Config`` when it validates a workflow, and ``engine --help`` must
stay fast.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from engine.core.data import DataSourceConfig
from engine.core.errors import InputError, MissingDependency, Problem
from engine.core.refs import FileOrInput

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact

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


def source_error(
    source: str, where: str, message: str, *, given: str | None = None, expected: str | None = None, hint: str | None = None
) -> InputError:
    """An InputError about option ``where`` of data source ``source``."""
    return InputError([Problem(where=f"{source}.{where}", message=message, given=given, expected=expected, hint=hint)])


class TokenizedConfig(DataSourceConfig):
    """The tokenizer options of a source whose samples are text."""

    tokenizer: FileOrInput = Field(
        default="input",
        description="`input` for the tokenizer saved with the workflow's input model (a Hugging Face folder), or a folder holding a Hugging Face tokenizer.",
    )
    max_length: int = Field(
        default=128, ge=1, description="Tokens per sample, special tokens included: longer samples are truncated, shorter ones padded."
    )
    padding: Literal["max_length", "longest"] = Field(
        default="max_length",
        description="`max_length` pads every sample to max_length; `longest` pads to the longest sample (at most max_length when truncating).",
    )
    truncation: bool = Field(
        default=True, description="Cut samples longer than max_length. Without it a longer sample is an error under `max_length` padding."
    )


def tokenizer_folder(source: str, option: str, input_model: ModelArtifact | None) -> Path:
    """The folder of the tokenizer that ``option`` (a folder, or ``input``) names."""
    if option != "input":
        folder = Path(option)
    elif input_model is not None and input_model.format == "hf":
        folder = Path(input_model.path)
    elif input_model is not None and input_model.attrs.get("tokenizer"):
        # a model exported elsewhere may carry the folder of the tokenizer it was made with
        folder = Path(input_model.attrs["tokenizer"])
    else:
        given = "no input model" if input_model is None else f"a {input_model.format} input model"
        raise source_error(
            source,
            "tokenizer",
            "`tokenizer: input` needs the workflow's input model to be a Hugging Face folder that holds its tokenizer",
            given=given,
            hint="set `tokenizer:` to a folder holding a Hugging Face tokenizer",
        )
    if not folder.is_dir():
        raise source_error(source, "tokenizer", "the tokenizer folder does not exist", given=str(folder))
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise source_error(
            source,
            "tokenizer",
            "the folder holds no tokenizer files",
            given=str(folder),
            expected=f"at least one of {', '.join(TOKENIZER_FILES)}",
            hint="save one with tokenizer.save_pretrained(folder)",
        )
    return folder


@contextmanager
def _hub_off() -> Iterator[None]:
    """The hub switched off while transformers loads (nothing is ever downloaded), and the process's
    environment given back as it was after: a process that reads a tokenizer may still use the Hub
    for other work (an input model named by its Hub id)."""
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    before = {name: os.environ.get(name) for name in names}
    os.environ.update(dict.fromkeys(names, "1"))
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def load_tokenizer(source: str, folder: Path, trust_remote_code: bool = False) -> Any:
    with _hub_off():
        try:
            from transformers import AutoTokenizer
        except ImportError as error:
            raise MissingDependency("transformers", f"the {source} data source") from error
        try:
            return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=trust_remote_code)
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise source_error(
                source, "tokenizer", f"transformers could not load a tokenizer from the folder: {error}", given=str(folder)
            ) from error


def input_tokenizer(source: str, cfg: TokenizedConfig, input_model: ModelArtifact | None) -> tuple[Any, Path]:
    """The tokenizer ``cfg.tokenizer`` names (and its folder)."""
    folder = tokenizer_folder(source, cfg.tokenizer, input_model)
    # the input's tokenizer runs its folder's code only when the workflow says so (input.trust_remote_code)
    remote_code = cfg.tokenizer == "input" and input_model is not None and input_model.attrs.get("trust_remote_code") is True
    return load_tokenizer(source, folder, remote_code), folder


def tokenize(
    source: str,
    texts: list[str],
    cfg: TokenizedConfig,
    input_model: ModelArtifact | None,
    path: str,
    pairs: list[str] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``texts`` (with ``pairs``: each text and its pair, as a sentence-pair task reads them) as
    padded int64 arrays by input name (``input_ids``, ``attention_mask``, ...), plus what the meta
    of the dataset records about the tokenization."""
    import numpy as np

    tokenizer, folder = input_tokenizer(source, cfg, input_model)
    padded_with = None
    if tokenizer.pad_token is None:
        # a decoder's tokenizer often has none: pad with its end-of-sequence token, which the
        # attention mask marks as padding (what a generation or perplexity evaluator reads)
        padded_with = tokenizer.eos_token or tokenizer.unk_token
        if padded_with is None:
            raise source_error(
                source,
                "tokenizer",
                "the tokenizer has no padding token, nor an end-of-sequence or unknown token to pad with",
                given=str(folder),
                hint="use a tokenizer that defines pad_token",
            )
        tokenizer.pad_token = padded_with
    lengths = [len(ids) for ids in tokenizer(texts, pairs, truncation=False, padding=False)["input_ids"]]
    too_long = [index for index, length in enumerate(lengths) if length > cfg.max_length]
    if too_long and not cfg.truncation and cfg.padding == "max_length":
        first = too_long[0]
        raise source_error(
            source,
            "max_length",
            f"{len(too_long)} sample(s) have more than max_length={cfg.max_length} tokens (sample {first + 1} has {lengths[first]}) and truncation is off",
            given=path,
            hint="set truncation: true, raise max_length, or use padding: longest",
        )
    encoded = tokenizer(
        texts,
        pairs,
        padding=cfg.padding,
        truncation=cfg.truncation,
        max_length=cfg.max_length if (cfg.truncation or cfg.padding == "max_length") else None,
    )
    inputs = {name: np.asarray(values, dtype=np.int64) for name, values in encoded.items()}
    meta = {
        "sequence_length": int(next(iter(inputs.values())).shape[1]),
        "tokenizer": str(folder),
        "tokenizer_class": type(tokenizer).__name__,
        "padding": cfg.padding,
        "max_length": cfg.max_length,
        "truncated_samples": len(too_long) if cfg.truncation else 0,
    }
    if padded_with is not None:
        meta["padded_with"] = padded_with
    return inputs, meta
