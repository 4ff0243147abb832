"""The accuracy evaluator on tiny linear ONNX classifiers whose predictions numpy knows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydantic
import pytest

from engine.core.data import Dataset
from engine.core.errors import EvaluationError
from engine.core.refs import RefKind, references
from evaluators.accuracy import Accuracy, f1_scores

IDENTITY = np.eye(3, dtype=np.float32)
# logits = inputs: predictions 0, 1, 2, 0 (then 1, then 2) against labels 0, 1, 2, 2
INPUTS = np.array([[3, 1, 0], [0, 5, 1], [1, 0, 2], [2, 1, 0.5]], dtype=np.float32)
LABELS = np.array([0, 1, 2, 2])


def labelled(inputs: np.ndarray = INPUTS, labels: np.ndarray | None = LABELS) -> Dataset:
    return Dataset(inputs={"input": inputs}, labels=labels)


def accuracy(**options: object) -> Accuracy:
    return Accuracy(Accuracy.Config(data="d", **options))


def test_top1_and_f1_are_exact(make_classifier, make_ctx) -> None:
    result = accuracy().evaluate(make_classifier(IDENTITY), make_ctx(d=labelled()))
    assert result.values["top1"] == 0.75
    assert result.values["f1_micro"] == 0.75
    assert result.values["f1_macro"] == pytest.approx(7 / 9)
    assert result.values["samples"] == 4
    assert set(result.values) == {"top1", "f1_macro", "f1_micro", "samples"}
    assert result.details["output"] == "logits"
    assert result.details["classes"] == 3
    assert result.details["label_counts"] == {"0": 1, "1": 1, "2": 2}


def test_top_k_counts_a_label_among_the_k_best(make_classifier, make_ctx) -> None:
    result = accuracy(top_k=[1, 2, 3, 5], f1=False).evaluate(make_classifier(IDENTITY), make_ctx(d=labelled()))
    assert result.values == {"top1": 0.75, "top2": 0.75, "top3": 1.0, "top5": 1.0, "samples": 4.0}
    assert result.details["trivial_top_k"] == [3, 5]
    assert set(result.values) <= set(Accuracy.metrics)


def test_batches_and_max_samples(make_classifier, make_ctx) -> None:
    model = make_classifier(IDENTITY)
    assert accuracy(batch_size=3).evaluate(model, make_ctx(d=labelled())).values["top1"] == 0.75
    first3 = accuracy(max_samples=3).evaluate(model, make_ctx(d=labelled())).values
    assert first3["top1"] == 1.0 and first3["samples"] == 3


def test_f1_matches_scikit_learn() -> None:
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(0)
    truth, predicted = rng.integers(0, 5, 200), rng.integers(0, 6, 200)
    macro, micro = f1_scores(truth, predicted)
    assert macro == pytest.approx(f1_score(truth, predicted, average="macro"))
    assert micro == pytest.approx(f1_score(truth, predicted, average="micro"))


def test_a_logistic_regression_scores_what_scikit_learn_scores(make_classifier, make_ctx) -> None:
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    features, labels = load_iris(return_X_y=True)
    features = features.astype(np.float32)
    classifier = LogisticRegression(max_iter=1000).fit(features, labels)
    model = make_classifier(classifier.coef_.T, classifier.intercept_)
    result = accuracy(batch_size=16).evaluate(model, make_ctx(d=labelled(features, labels)))
    assert result.values["top1"] == pytest.approx(classifier.score(features, labels))
    assert result.values["samples"] == 150


def test_an_output_can_be_chosen_by_name(make_classifier, make_ctx) -> None:
    model = make_classifier(IDENTITY, output_name="probabilities")
    assert accuracy(output="probabilities").evaluate(model, make_ctx(d=labelled())).values["top1"] == 0.75
    with pytest.raises(EvaluationError, match=r"no output 'logits'.*probabilities"):
        accuracy(output="logits").evaluate(model, make_ctx(d=labelled()))


def test_a_dataset_without_labels_is_an_evaluation_error(make_classifier, make_ctx) -> None:
    with pytest.raises(EvaluationError, match="dataset 'd' has no labels"):
        accuracy().evaluate(make_classifier(IDENTITY), make_ctx(d=labelled(labels=None)))


def test_labels_the_model_cannot_produce_are_named(make_classifier, make_ctx) -> None:
    with pytest.raises(EvaluationError, match="dataset 'd' has labels the model cannot produce: 3, 7") as caught:
        accuracy().evaluate(make_classifier(IDENTITY), make_ctx(d=labelled(labels=np.array([0, 3, 7, 3]))))
    assert "classes 0..2" in str(caught.value)


def test_non_integer_labels_are_an_evaluation_error(make_classifier, make_ctx) -> None:
    with pytest.raises(EvaluationError, match="non-integer labels"):
        accuracy().evaluate(make_classifier(IDENTITY), make_ctx(d=labelled(labels=np.array([0.5, 1, 2, 2]))))


def write_postprocess(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "post.py"
    path.write_text("import numpy as np\n\n\n" + body, encoding="utf-8")
    return path


def test_postprocess_can_reverse_the_scores(tmp_path, make_classifier, make_ctx) -> None:
    path = write_postprocess(tmp_path, "def lowest(logits):\n    return -logits\n")
    result = accuracy(postprocess=str(path), postprocess_function="lowest").evaluate(make_classifier(IDENTITY), make_ctx(d=labelled()))
    # lowest scores: 2, 0, 1, 2 against 0, 1, 2, 2
    assert result.values["top1"] == 0.25
    assert result.details["postprocess"].endswith("post.py:lowest")


def test_postprocess_may_return_class_ids(tmp_path, make_classifier, make_ctx) -> None:
    path = write_postprocess(tmp_path, "def postprocess(logits):\n    return np.full(len(logits), 2)\n")
    model = make_classifier(IDENTITY)
    assert accuracy(postprocess=str(path)).evaluate(model, make_ctx(d=labelled())).values["top1"] == 0.5
    with pytest.raises(EvaluationError, match="needs class scores"):
        accuracy(postprocess=str(path), top_k=[1, 2]).evaluate(model, make_ctx(d=labelled()))


def test_a_failing_postprocess_is_told_with_its_line(tmp_path, make_classifier, make_ctx) -> None:
    path = write_postprocess(tmp_path, "def postprocess(logits):\n    return logits / undefined\n")
    with pytest.raises(EvaluationError, match=r"NameError.*post.py:5 in postprocess"):
        accuracy(postprocess=str(path)).evaluate(make_classifier(IDENTITY), make_ctx(d=labelled()))


def test_a_missing_postprocess_function_lists_what_the_file_defines(tmp_path, make_classifier, make_ctx) -> None:
    path = write_postprocess(tmp_path, "def softmax(x):\n    return x\n")
    with pytest.raises(EvaluationError, match=r"'postprocess' is not defined.*softmax"):
        accuracy(postprocess=str(path)).evaluate(make_classifier(IDENTITY), make_ctx(d=labelled()))


def test_config_allows_only_the_declared_top_k() -> None:
    with pytest.raises(pydantic.ValidationError):
        accuracy(top_k=[4])
    with pytest.raises(pydantic.ValidationError):
        accuracy(top_k=[])
    assert references(Accuracy.Config)[RefKind.FILE] == ("postprocess",)
    assert references(Accuracy.Config)[RefKind.DATASET] == ("data",)
