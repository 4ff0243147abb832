"""The small datasets bundled with scikit-learn (digits, iris, wine, breast cancer): labelled,
offline, ready for tiny classifiers in examples and tests. Nothing is ever downloaded (no
``fetch_*`` datasets).

scikit-learn is imported inside ``load``, never at module import: the engine imports this module to
read ``Config`` when it validates a workflow, and ``engine --help`` must stay fast.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field

from engine.core.data import Dataset, DataSource, DataSourceConfig
from engine.core.errors import MissingDependency
from evaluators.data._tokenize import source_error

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact
    from engine.core.target import TensorSpec

logger = logging.getLogger(__name__)

#: dataset name → the scikit-learn loader of a dataset shipped inside the package
LOADERS = {
    "digits": "load_digits",
    "iris": "load_iris",
    "wine": "load_wine",
    "breast_cancer": "load_breast_cancer",
}


class Sklearn(DataSource):
    name = "sklearn"
    summary = "A labelled dataset bundled with scikit-learn (digits, iris, wine, breast_cancer), read offline."
    version = "1"
    libraries = ("scikit-learn",)

    class Config(DataSourceConfig):
        source: Literal["sklearn"] = Field(description="Reads a dataset bundled with scikit-learn.")
        name: Literal["digits", "iris", "wine", "breast_cancer"] = Field(
            description=(
                "digits: 1797 8x8 images of handwritten digits (64 features, 0..16, 10 classes); iris: 150 flowers (4 features, 3 classes); "
                "wine: 178 wines (13 features, 3 classes); breast_cancer: 569 tumours (30 features, 2 classes). "
                "Samples keep scikit-learn's order (iris is sorted by class): use a `fraction` split for a random part."
            )
        )
        input_name: str = Field(default="input", description="The model input the features feed.")
        dtype: Literal["float32", "float64"] = Field(default="float32", description="Element type of the features.")
        reshape: list[int] | None = Field(
            default=None,
            min_length=1,
            description="Shape of one sample, e.g. [1, 8, 8] to feed digits to a CNN as one-channel images; its product must equal the feature count. Omit for flat [features].",
        )
        scale: float | None = Field(
            default=None,
            description="Multiply every feature by this, e.g. 0.0625 (1/16) to bring digits to [0, 1]. Omit to keep the values.",
        )

    config: Config

    def load(self, input_model: ModelArtifact | None, signature: list[TensorSpec] | None = None) -> Dataset:
        try:
            from sklearn import datasets
        except ImportError as error:
            raise MissingDependency("scikit-learn", "the sklearn data source") from error
        cfg = self.config
        bunch = getattr(datasets, LOADERS[cfg.name])()
        features = np.asarray(bunch.data, dtype=np.float64)
        if cfg.scale is not None:
            features = features * cfg.scale
        count, width = features.shape
        if cfg.reshape is not None:
            if any(dim < 1 for dim in cfg.reshape) or math.prod(cfg.reshape) != width:
                raise source_error(
                    self.name,
                    "reshape",
                    f"dataset '{cfg.name}' has {width} features per sample, which cannot take the shape {cfg.reshape}",
                    expected=f"positive dims whose product is {width}",
                    given=str(cfg.reshape),
                    hint="e.g. [1, 8, 8] for digits" if cfg.name == "digits" else f"e.g. [{width}]",
                )
            features = features.reshape(count, *cfg.reshape)
        inputs = {cfg.input_name: np.ascontiguousarray(features.astype(cfg.dtype))}
        labels = np.asarray(bunch.target, dtype=np.int64)
        classes = [str(name) for name in bunch.target_names]
        meta = {
            "source": self.name,
            "name": cfg.name,
            "samples": int(count),
            "features": int(width),
            "shape": list(features.shape[1:]),
            "classes": classes,
            "feature_names": [str(name) for name in getattr(bunch, "feature_names", [])],
            "inputs": [cfg.input_name],
        }
        logger.debug("sklearn: %s, %d samples of shape %s", cfg.name, count, meta["shape"])
        return Dataset(inputs=inputs, labels=labels, meta=meta)
