"""Accuracy: how often a classifier's predicted class is the dataset's label.

The model's output (scores or logits per class, [batch, classes]) gives the predicted class by
argmax and the top-k classes by score; top-k accuracy, macro and micro F1 of the top-1 prediction
follow. A ``postprocess`` function from a file can turn any other output into scores or class ids.
numpy is imported inside functions: the engine imports this module at validate time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from engine.core.errors import EvaluationError
from engine.core.evaluator import EvalContext, Evaluator, EvaluatorConfig, MetricResult, Samples
from engine.core.refs import DatasetRef, FilePath
from evaluators._sessions import dataset, open_session, run_session, select_feeds
from evaluators._usercode import describe_exception, load_function

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact
    from engine.core.data import Dataset
    from engine.core.target import Session

logger = logging.getLogger(__name__)

TOP_K = (1, 2, 3, 5)


class Accuracy(Evaluator):
    """Classification accuracy on a labelled dataset.

    Returns ``top<k>`` for each k of ``top_k`` (the share of samples whose label is among the k
    best-scored classes; with k at or above the number of classes it is 1), ``f1_macro`` and
    ``f1_micro`` when ``f1`` is on (of the top-1 prediction; classes are those found in the labels
    or the predictions), and ``samples``. Metric names not asked for are not returned.
    """

    name = "accuracy"
    summary = "Top-k accuracy and F1 (macro, micro) of a classifier's argmax prediction against a labelled dataset."
    version = "1"
    metrics = ("top1", "top2", "top3", "top5", "f1_macro", "f1_micro", "samples")

    class Config(EvaluatorConfig):
        data: DatasetRef = Field(
            description="A labelled dataset (e.g. csv/jsonl with label_column, npz with labels, image_folder, sklearn)."
        )
        output: str | None = Field(default=None, description="The model output holding class scores. Omit for the first output.")
        top_k: list[Literal[1, 2, 3, 5]] = Field(
            default_factory=lambda: [1],
            min_length=1,
            description="Which top-k accuracies to report (each gives `top<k>`): any of 1, 2, 3, 5.",
        )
        f1: bool = Field(default=True, description="Also report macro F1 (the mean of per-class F1) and micro F1 of the top-1 prediction.")
        batch_size: int = Field(
            default=1, ge=1, description="Samples per inference (more is faster where the model takes a dynamic batch)."
        )
        max_samples: int | None = Field(default=None, ge=1, description="Score the first N samples only. Omit for the whole dataset.")
        postprocess: FilePath | None = Field(
            default=None,
            description=(
                "A Python file whose function `postprocess_function` turns the chosen output of one batch (a numpy array) into "
                "scores [batch, classes] or class ids [batch]. This runs code from that file in the worker. Omit to use the output as scores."
            ),
        )
        postprocess_function: str = Field(default="postprocess", description="The function of the `postprocess` file to call.")

    config: Config

    def _postprocess(self) -> Callable[[Any], Any] | None:
        if self.config.postprocess is None:
            return None
        return load_function(self.config.postprocess, self.config.postprocess_function, "postprocess")

    def evaluate(self, model: ModelArtifact, ctx: EvalContext) -> MetricResult:
        import numpy as np

        cfg = self.config
        data = dataset(ctx, cfg.data)
        labels = _labels(data, cfg.data)
        count = len(data) if cfg.max_samples is None else min(cfg.max_samples, len(data))
        postprocess = self._postprocess()
        session = open_session(ctx, model)
        try:
            index = self._output_index(session)
            scores_or_ids = self._predict(session, data, index, count, postprocess)
        finally:
            session.close()

        truth = labels[:count]
        classes = scores_or_ids.shape[1] if scores_or_ids.ndim == 2 else None
        _check_labels(truth, classes, cfg.data)
        if classes is None:
            predicted = scores_or_ids.astype(np.int64)
            asked = [k for k in cfg.top_k if k > 1]
            if asked:
                raise EvaluationError(
                    f"top_k {asked} needs class scores, but the output (after postprocess) holds one class id per sample; ask for top_k: [1]"
                )
        else:
            predicted = _top(scores_or_ids, 1)[:, 0]
        values: dict[str, float] = {}
        # per sample, right (1) or wrong (0): the top-k figures are their means, and the engine
        # bootstraps their intervals (paired with the reference's, sample by sample, for drops)
        samples: dict[str, Samples] = {}
        for k in sorted(set(cfg.top_k)):
            if k == 1:
                hits = predicted == truth
            else:
                assert classes is not None
                hits = (_top(scores_or_ids, min(k, classes)) == truth[:, None]).any(axis=1)
            values[f"top{k}"] = float(np.mean(hits))
            samples[f"top{k}"] = Samples("mean", hits.astype(np.float64).tolist())
        if cfg.f1:
            values["f1_macro"], values["f1_micro"] = f1_scores(truth, predicted)
        values["samples"] = float(count)
        details: dict[str, Any] = {
            "data": cfg.data,
            "dataset_size": len(data),
            "samples": count,
            "output": session.outputs[index].name,
            "classes": classes,
            "batch_size": cfg.batch_size,
            "postprocess": f"{cfg.postprocess}:{cfg.postprocess_function}" if cfg.postprocess else None,
            "trivial_top_k": [k for k in cfg.top_k if classes is not None and k >= classes],
            "label_counts": {str(int(label)): int(n) for label, n in zip(*np.unique(truth, return_counts=True), strict=True)},
            "target": ctx.target.id,
        }
        if "classes" in data.meta:
            details["class_names"] = data.meta["classes"]
        logger.debug("accuracy of %s: top1 %.4f over %d samples", model.digest[:12], values.get("top1", float("nan")), count)
        return MetricResult(values=values, details=details, samples=samples)

    def _output_index(self, session: Session) -> int:
        names = [spec.name for spec in session.outputs]
        if self.config.output is None:
            return 0
        if self.config.output not in names:
            raise EvaluationError(f"the model has no output '{self.config.output}' (outputs: {', '.join(names)})")
        return names.index(self.config.output)

    def _predict(self, session: Session, data: Dataset, index: int, count: int, postprocess: Callable[[Any], Any] | None) -> np.ndarray:
        """Class scores [count, classes] or class ids [count] for the first ``count`` samples."""
        import numpy as np

        cfg = self.config
        parts = []
        for batch in data.batches(cfg.batch_size, limit=count):
            output = run_session(session, select_feeds(session.inputs, batch, cfg.data))[index]
            if postprocess is not None:
                try:
                    output = postprocess(output)
                except Exception as error:  # the user's code: its failure is told with where it happened
                    where = f"{cfg.postprocess}:{cfg.postprocess_function}"
                    raise EvaluationError(
                        f"the postprocess function {where} failed: {describe_exception(error, Path(str(cfg.postprocess)))}"
                    ) from error
            parts.append(_as_predictions(output, len(next(iter(batch.values()))), session.outputs[index].name))
        shapes = {part.shape[1:] for part in parts}
        if len(shapes) > 1:
            raise EvaluationError(f"batches gave predictions of different shapes {sorted(shapes)}: the number of classes must not change")
        return np.concatenate(parts)


def _as_predictions(output: Any, batch: int, name: str) -> np.ndarray:
    """An output as scores [batch, classes] or class ids [batch]: axes of length 1 after the
    first are dropped ([batch, 1, classes] → [batch, classes])."""
    import numpy as np

    array = np.asarray(output)
    if array.ndim == 0 or array.shape[0] != batch:
        raise EvaluationError(f"output '{name}' has shape {list(array.shape)}; expected the batch of {batch} first")
    if array.ndim > 2:
        kept = [dim for dim in array.shape[1:] if dim != 1]
        array = array.reshape(batch, *kept) if len(kept) <= 1 else array
    if array.ndim > 2:
        raise EvaluationError(
            f"output '{name}' has shape {list(array.shape)}: accuracy needs scores [batch, classes] or class ids [batch]; "
            "choose another `output`, or turn it into one with `postprocess`"
        )
    if array.ndim == 1 and array.dtype.kind not in "iub":
        if not np.all(np.isfinite(array)) or not np.all(array == np.round(array)):
            raise EvaluationError(
                f"output '{name}' is one float per sample, not class ids: give scores [batch, classes] or integer class ids"
            )
    if array.ndim == 2 and array.dtype.kind not in "iubf":
        raise EvaluationError(f"output '{name}' holds {array.dtype} values, not class scores")
    return array


def _labels(data: Dataset, name: str) -> np.ndarray:
    import numpy as np

    if data.labels is None:
        raise EvaluationError(
            f"dataset '{name}' has no labels: accuracy needs one class id per sample "
            "(csv/jsonl: set label_column; npz: set labels; image_folder and sklearn always have them)"
        )
    labels = np.asarray(data.labels)
    if labels.ndim != 1:
        raise EvaluationError(f"dataset '{name}' has labels of shape {list(labels.shape)}; accuracy needs one class id per sample")
    if labels.dtype.kind == "f":
        if not np.all(np.isfinite(labels)) or not np.all(labels == np.round(labels)):
            raise EvaluationError(
                f"dataset '{name}' has non-integer labels (e.g. {labels[labels != np.round(labels)][:3].tolist()}); accuracy needs class ids"
            )
    elif labels.dtype.kind not in "iub":
        raise EvaluationError(f"dataset '{name}' has {labels.dtype} labels; accuracy needs integer class ids (map strings with label_map)")
    return labels.astype(np.int64)


def _check_labels(truth: np.ndarray, classes: int | None, name: str) -> None:
    import numpy as np

    bad = truth[truth < 0] if classes is None else truth[(truth < 0) | (truth >= classes)]
    if bad.size:
        shown = ", ".join(str(int(v)) for v in np.unique(bad)[:10])
        can = "non-negative class ids" if classes is None else f"classes 0..{classes - 1} ({classes} output scores)"
        raise EvaluationError(
            f"dataset '{name}' has labels the model cannot produce: {shown} ({bad.size} sample(s)); the model gives {can}. "
            "Check the label mapping (label_map) or the output"
        )


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best scores per row, best first; ties go to the lower class id."""
    import numpy as np

    return np.argsort(-scores.astype(np.float64), axis=1, kind="stable")[:, :k]


def f1_scores(truth: np.ndarray, predicted: np.ndarray) -> tuple[float, float]:
    """Macro and micro F1 of single-label predictions over the classes seen in either array
    (as scikit-learn's ``f1_score`` does); micro F1 equals accuracy for single-label data."""
    import numpy as np

    classes = np.union1d(truth, predicted)
    per_class = []
    for label in classes:
        tp = int(np.sum((predicted == label) & (truth == label)))
        fp = int(np.sum((predicted == label) & (truth != label)))
        fn = int(np.sum((predicted != label) & (truth == label)))
        per_class.append(2 * tp / (2 * tp + fp + fn) if (2 * tp + fp + fn) else 0.0)
    macro = float(np.mean(per_class)) if per_class else 0.0
    tp_all = int(np.sum(predicted == truth))
    micro = tp_all / len(truth) if len(truth) else 0.0
    return macro, float(micro)
