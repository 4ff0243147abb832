"""Random inputs shaped after the consuming model's input signature: for latency, smoke tests and
calibration when no real data is at hand. Deterministic for a seed."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from engine.core.data import Dataset, DataSource, DataSourceConfig, synthetic_feeds
from engine.core.errors import InputError, Problem
from engine.core.target import TensorSpec

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact

logger = logging.getLogger(__name__)


class Synthetic(DataSource):
    name = "synthetic"
    summary = "Random inputs of the names, dtypes and shapes the model declares (masks ones, type ids zeros, token ids uniform)."
    version = "1"
    needs_signature = True

    class Config(DataSourceConfig):
        source: Literal["synthetic"] = Field(description="Makes random inputs from the model's input signature.")
        samples: int = Field(default=32, ge=1, description="How many samples (rows along the first axis of every input).")
        sequence_length: int = Field(default=128, ge=1, description="The length given to every unnamed symbolic axis after the first.")
        dims: dict[str, int] = Field(
            default_factory=dict, description="Lengths for named symbolic axes, e.g. {sequence: 64}; they win over sequence_length."
        )
        seed: int = Field(default=0, description="Seed of the random generator: the same seed gives the same data.")
        int_high: int = Field(
            default=1000, ge=1, description="Integer inputs other than masks and type ids are drawn uniformly from [0, int_high)."
        )

    config: Config

    def load(self, input_model: ModelArtifact | None, signature: list[TensorSpec] | None = None) -> Dataset:
        if signature is None:
            raise InputError(
                [
                    Problem(
                        where="synthetic",
                        message="synthetic data is made from the consuming model's input signature, and none was given",
                        hint="use this dataset from an evaluator or pass that has a model at hand",
                    )
                ]
            )
        scalars = [spec.name for spec in signature if not spec.shape]
        if scalars:
            raise InputError(
                [
                    Problem(
                        where="synthetic", message=f"cannot make samples for scalar input(s) {', '.join(scalars)}: there is no sample axis"
                    )
                ]
            )
        # Every sample is one row of batch 1: the first axis of every input becomes the sample
        # axis, even where the model fixes it (a static batch of 1 still yields `samples` rows).
        rows = [TensorSpec(spec.name, spec.dtype, (None, *spec.shape[1:])) for spec in signature]
        cfg = self.config
        inputs = synthetic_feeds(
            rows, batch_size=cfg.samples, sequence_length=cfg.sequence_length, seed=cfg.seed, dims=cfg.dims, int_high=cfg.int_high
        )
        logger.debug("synthetic: %d samples for inputs %s", cfg.samples, ", ".join(inputs))
        meta = {
            "source": self.name,
            "samples": cfg.samples,
            "seed": cfg.seed,
            "shapes": {name: list(array.shape) for name, array in inputs.items()},
            "signature": [spec.to_json() for spec in signature],
        }
        return Dataset(inputs=inputs, meta=meta)
