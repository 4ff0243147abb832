"""A dataset of the Hugging Face Hub, read from the Hub cache with the ``datasets`` library.

``{source: hf_dataset, name: ORG/NAME, config: SUBSET, hf_split: validation, revision: main,
text_column: sentence, label_column: label}``. Before the run the engine finds the dataset in
huggingface_hub's cache (``<cache>/datasets--ORG--NAME/snapshots/<commit>/``, the layout ``hf
download ORG/NAME --repo-type dataset`` writes), pins the commit the revision names (recorded in
workflow.lock.json) and hashes the snapshot's files into the dataset's key; it sets ``commit`` and
``folder`` here. The source then reads that snapshot with ``datasets.load_dataset(folder, config,
split=...)``, which follows the repo's own README configs and reads its parquet / json / csv files
without a network (a Hub dataset by name needs the Hub, or the datasets library's own prepared
cache, even offline). Nothing is downloaded: fetch the dataset on a connected machine.

The rows then become samples as a CSV's rows do (``tabular``): a text column tokenized with the
input model's tokenizer (``join``: cut into windows of max_length tokens), or numeric feature
columns, or (``image_column``) images resized and normalized as ``image_folder`` does; a label
column gives labels.

``datasets`` is imported only when the data is read: the engine imports this module to read
``Config`` when it validates a workflow.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from engine.core.data import Dataset
from engine.core.errors import MissingDependency
from evaluators.data._tokenize import input_tokenizer, tokenize
from evaluators.data.image_folder import normalized, scaled
from evaluators.data.tabular import ColumnsConfig, Table, _Tabular

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact
    from engine.core.target import TensorSpec

logger = logging.getLogger(__name__)


class HfDataset(_Tabular):
    name = "hf_dataset"
    summary = "A Hugging Face Hub dataset (name, config, split, revision) read from the Hub cache with the datasets library; its rows as a table's."
    version = "1"
    libraries = ("datasets", "transformers", "tokenizers", "pillow")
    hub_dataset = True

    class Config(ColumnsConfig):
        source: Literal["hf_dataset"] = Field(description="Reads a Hugging Face Hub dataset from the Hub cache.")
        name: str = Field(description="The dataset's repo id on the Hub (ORG/NAME, e.g. nyu-mll/glue, Salesforce/wikitext).")
        config: str | None = Field(
            default=None, description="The dataset's configuration (subset), e.g. sst2, wikitext-2-raw-v1. Omit for its default one."
        )
        hf_split: str = Field(
            default="train",
            description="The dataset's split, in the datasets library's syntax: train, validation, test[:100], train[10%:20%].",
        )
        revision: str = Field(
            default="main",
            description="A branch, a tag or a commit of the dataset's repo. The commit it names in the cache is recorded in workflow.lock.json and its files enter the dataset's key.",
        )
        text_pair_column: str | None = Field(
            default=None,
            description="With text_column: the column holding each sample's second text, tokenized as a pair with it (sentence-pair tasks: MRPC, MNLI).",
        )
        join: bool = Field(
            default=False,
            description=(
                "With text_column: join the rows' texts (blank lines kept, in order) into one text, tokenize it and cut it into "
                "samples of exactly max_length tokens (a language model's calibration on a corpus such as wikitext); "
                "`limit` then counts those samples."
            ),
        )
        image_column: str | None = Field(
            default=None,
            description="The column holding images (the datasets library's Image feature): each converted, resized to `size`, scaled to [0, 1] and normalized by `mean` / `std` into one float32 input named `input_name`. Give this, `text_column` or `feature_columns`.",
        )
        size: list[int] = Field(
            default_factory=lambda: [224, 224],
            min_length=2,
            max_length=2,
            description="[height, width] every image is resized to (image_column).",
        )
        resample: Literal["nearest", "bilinear", "bicubic", "lanczos"] = Field(
            default="bilinear", description="The resize's filter (image_column)."
        )
        grayscale: bool = Field(default=False, description="One channel (L) instead of three (RGB) (image_column).")
        mean: list[float] | None = Field(
            default=None, min_length=1, description="Subtracted per channel from the [0, 1] pixels (image_column). Omit for 0."
        )
        std: list[float] | None = Field(
            default=None, min_length=1, description="Divides per channel after the mean (image_column). Omit for 1."
        )
        layout: Literal["NCHW", "NHWC"] = Field(default="NCHW", description="Axis order of the images (image_column).")
        commit: str | None = Field(default=None, description="Set by Kiln: the commit `revision` names in the Hub cache.")
        folder: str | None = Field(default=None, description="Set by Kiln: that commit's snapshot folder in the Hub cache.")

    config: Config

    def load(self, input_model: ModelArtifact | None, signature: list[TensorSpec] | None = None) -> Dataset:
        cfg = self.config
        if not cfg.folder or not Path(cfg.folder).is_dir():
            raise self.error(
                "name",
                f"the Hub dataset {cfg.name} ({cfg.revision}) is not in the Hugging Face datasets cache",
                given=str(cfg.folder or "(no snapshot)"),
                hint=f"fetch it on a connected machine: `hf download {cfg.name} --repo-type dataset --revision {cfg.revision}`",
            )
        origin = f"{cfg.name}@{(cfg.commit or cfg.revision)[:12]} {cfg.config or '(default config)'} {cfg.hf_split}"
        if cfg.join:
            return self.joined(self.read_table(Path(cfg.folder)), input_model, origin)
        if cfg.image_column is not None:
            return self.images(self.read_table(Path(cfg.folder)), origin)
        return self.from_table(self.read_table(Path(cfg.folder)), input_model, origin)

    def tokenized(
        self, table: Table, texts: list[str], input_model: ModelArtifact | None, origin: str
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        column = self.config.text_pair_column
        if column is None:
            return super().tokenized(table, texts, input_model, origin)
        self._check_column(table, "text_pair_column", column)
        pairs = [self._text(table, index, column) for index in range(len(table.rows))]
        inputs, meta = tokenize(self.name, texts, self.config, input_model, origin, pairs=pairs)
        return inputs, {**meta, "text_pair_column": column}

    def joined(self, table: Table, input_model: ModelArtifact | None, origin: str) -> Dataset:
        """Every row's text joined, tokenized once and cut into samples of max_length tokens."""
        import numpy as np

        cfg = self.config
        assert cfg.text_column is not None
        self.origin = origin
        self._check_column(table, "text_column", cfg.text_column)
        text = "\n\n".join(str(row.get(cfg.text_column) or "") for row in table.rows)
        tokenizer, folder = input_tokenizer(self.name, cfg, input_model)
        ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        count = len(ids) // cfg.max_length
        if cfg.limit is not None:
            count = min(count, cfg.limit)
        if count == 0:
            raise self.error(
                "max_length",
                f"the split's text is {len(ids)} tokens long: not one sample of max_length={cfg.max_length} tokens",
                given=origin,
                hint="lower max_length, or choose a larger split",
            )
        input_ids = ids[: count * cfg.max_length].reshape(count, cfg.max_length)
        inputs = {"input_ids": input_ids, "attention_mask": np.ones_like(input_ids)}
        meta = {
            "source": self.name,
            "path": origin,
            "samples": count,
            "joined_rows": len(table.rows),
            "sequence_length": cfg.max_length,
            "tokenizer": str(folder),
            "tokenizer_class": type(tokenizer).__name__,
            "inputs": sorted(inputs),
        }
        return Dataset(inputs=inputs, meta=meta)

    def images(self, table: Table, origin: str) -> Dataset:
        """The image column's images as one float32 input (image_folder's resize and normalization), labels kept."""
        import numpy as np

        cfg = self.config
        assert cfg.image_column is not None
        self.origin = origin
        if cfg.limit is not None:
            table = Table(table.columns, table.rows[: cfg.limit], table.lines[: cfg.limit])
        self._check_column(table, "image_column", cfg.image_column)
        height, width = cfg.size
        pixels = np.empty((len(table.rows), height, width, 1 if cfg.grayscale else 3), dtype=np.float32)
        for index, row in enumerate(table.rows):
            image = row.get(cfg.image_column)
            if not hasattr(image, "convert"):  # not decoded by the datasets library's Image feature
                raise self.error(
                    "image_column",
                    f"row {index + 1}: column '{cfg.image_column}' holds {type(image).__name__}, not an image",
                    given=origin,
                    hint="name the dataset's image column (an Image feature)",
                )
            pixels[index] = scaled(image, cfg)
        inputs = {cfg.input_name: normalized(pixels, cfg)}
        meta: dict[str, Any] = {
            "source": self.name,
            "path": origin,
            "samples": len(table.rows),
            "shape": list(inputs[cfg.input_name].shape[1:]),
        }
        labels = None
        if cfg.label_column is not None:
            self._check_column(table, "label_column", cfg.label_column)
            labels, label_meta = self._labels(table, cfg.label_column)
            meta.update(label_meta)
        meta["inputs"] = [cfg.input_name]
        return Dataset(inputs=inputs, labels=labels, meta=meta)

    def _check_column(self, table: Table, option: str, column: str) -> None:
        if column not in table.columns:
            raise self.error(option, f"the dataset has no column '{column}'", expected="one of: " + ", ".join(table.columns), given=column)

    def read_table(self, path: Path) -> Table:
        """The split's rows, read from the snapshot folder ``path`` alone (a row's "line" is its index from 1)."""
        rows = self._rows(path)
        return Table(list(rows.column_names), [dict(row) for row in rows], list(range(1, len(rows) + 1)))

    def _rows(self, folder: Path) -> Any:
        """The split's rows (a ``datasets.Dataset``)."""
        cfg = self.config
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the snapshot is local: nothing to ask the Hub
        try:
            import datasets
        except ImportError as error:
            raise MissingDependency("datasets", "the hf_dataset data source") from error
        split = cfg.hf_split
        if cfg.limit is not None and "[" not in split and not cfg.join:
            split = f"{split}[:{cfg.limit}]"  # read no more rows than kept
        try:
            return datasets.load_dataset(str(folder), cfg.config, split=split)
        except (ValueError, FileNotFoundError, KeyError) as error:
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            where = "config" if "config" in first.lower() and cfg.config else "hf_split"
            raise self.error(
                where,
                f"the datasets library cannot read {cfg.name} ({cfg.config or 'default config'}, split {cfg.hf_split}): {first}",
                given=str(folder),
                hint="check `config` and `hf_split` against the dataset's card (its configurations and splits)",
            ) from error

    def format_hint(self) -> str:
        return "choose a split that holds rows"
