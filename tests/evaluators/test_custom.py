"""The custom evaluator: a metric function from a file, its contract and its failures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydantic
import pytest

from engine.core.data import Dataset
from engine.core.errors import EvaluationError
from engine.core.refs import RefKind, references
from evaluators.custom import Custom

IDENTITY = np.eye(3, dtype=np.float32)
INPUTS = np.array([[3, 1, 0], [0, 5, 1], [1, 0, 2], [2, 1, 0.5]], dtype=np.float32)
LABELS = np.array([0, 1, 2, 2])

METRICS = """
import numpy as np


def agreement(run, data, threshold=0.0, batch=2):
    hits = 0
    for start in range(0, len(data), batch):
        feeds = {name: array[start:start + batch] for name, array in data.inputs.items()}
        logits = run(feeds)["logits"]
        hits += int((logits.argmax(axis=1) == data.labels[start:start + batch]).sum())
    return {"agree": hits / len(data), "above": float((data.inputs["input"] > threshold).mean())}


def constant(run, data):
    assert data is None
    return np.float32(0.5)


def described(run, data):
    return {"inputs": len(run.inputs), "logits": float(run.outputs[0].name == "logits")}


def flag(run, data):
    return {"agree": True}


def broken(run, data):
    return 1 / 0


def not_a_number(run, data):
    return {"agree": "high"}


def nan(run, data):
    return {"agree": float("nan")}


def too_many(run, data):
    return {"agree": 1.0, "other": 2.0}


def wrong_feed(run, data):
    return {"agree": float(run({"nothing": np.zeros(1)})["logits"].sum())}
"""


@pytest.fixture
def metric_file(tmp_path: Path) -> Path:
    path = tmp_path / "metrics.py"
    path.write_text(METRICS, encoding="utf-8")
    return path


def custom(file: Path, function: str, metrics: list[str], **options: object) -> Custom:
    return Custom(Custom.Config(file=str(file), function=function, metrics=metrics, **options))


def labelled() -> Dataset:
    return Dataset(inputs={"input": INPUTS}, labels=LABELS)


def test_the_function_runs_the_model_on_the_dataset_with_options(metric_file, make_classifier, make_ctx) -> None:
    evaluator = custom(metric_file, "agreement", ["agree", "above"], data="d", options={"threshold": 1.5})
    result = evaluator.evaluate(make_classifier(IDENTITY), make_ctx(d=labelled()))
    assert result.values == {"agree": 0.75, "above": pytest.approx(float((INPUTS > 1.5).mean()))}
    assert result.details["inferences"] == 2
    assert result.details["options"] == {"threshold": 1.5}
    assert result.details["dataset_size"] == 4


def test_a_bare_number_is_accepted_for_a_single_metric_and_data_may_be_omitted(metric_file, make_classifier, make_ctx) -> None:
    result = custom(metric_file, "constant", ["half"]).evaluate(make_classifier(IDENTITY), make_ctx())
    assert result.values == {"half": 0.5}
    assert result.details["data"] is None


def test_the_runner_describes_the_model(metric_file, make_classifier, make_ctx) -> None:
    values = custom(metric_file, "described", ["inputs", "logits"]).evaluate(make_classifier(IDENTITY), make_ctx()).values
    assert values == {"inputs": 1.0, "logits": 1.0}


def test_a_missing_function_lists_what_the_file_defines(metric_file, make_classifier, make_ctx) -> None:
    with pytest.raises(EvaluationError, match="'agreemnt' is not defined") as caught:
        custom(metric_file, "agreemnt", ["agree"]).evaluate(make_classifier(IDENTITY), make_ctx())
    assert "agreement, broken, constant" in str(caught.value)
    assert "np" not in str(caught.value).split("defines:")[1]


def test_a_raising_function_is_an_evaluation_error_with_the_line(metric_file, make_classifier, make_ctx) -> None:
    with pytest.raises(EvaluationError, match=r"ZeroDivisionError: division by zero \(at metrics.py:\d+ in broken\)"):
        custom(metric_file, "broken", ["agree"]).evaluate(make_classifier(IDENTITY), make_ctx())


def test_a_failing_inference_names_the_missing_input(metric_file, make_classifier, make_ctx) -> None:
    with pytest.raises(EvaluationError, match="lacks input\\(s\\) input"):
        custom(metric_file, "wrong_feed", ["agree"]).evaluate(make_classifier(IDENTITY), make_ctx())


@pytest.mark.parametrize(
    ("function", "match"),
    [
        ("not_a_number", "'high' for 'agree'"),
        ("flag", "True for 'agree'"),
        ("nan", "nan for 'agree'"),
        ("too_many", "undeclared other"),
        ("constant", "it must return a dict"),
    ],
)
def test_returns_are_checked_against_the_declared_metrics(metric_file, make_classifier, make_ctx, function, match) -> None:
    metrics = ["agree", "more"] if function == "constant" else ["agree"]
    with pytest.raises(EvaluationError, match=match):
        custom(metric_file, function, metrics).evaluate(make_classifier(IDENTITY), make_ctx())


def test_a_file_that_does_not_import_is_an_evaluation_error(tmp_path, make_classifier, make_ctx) -> None:
    path = tmp_path / "bad.py"
    path.write_text("def f(run, data):\n    return {\n", encoding="utf-8")
    with pytest.raises(EvaluationError, match=r"importing .*bad.py failed: SyntaxError"):
        custom(path, "f", ["x"]).evaluate(make_classifier(IDENTITY), make_ctx())


def test_the_file_may_import_a_module_beside_it(tmp_path, make_classifier, make_ctx) -> None:
    (tmp_path / "helpers_for_custom.py").write_text("VALUE = 3\n", encoding="utf-8")
    path = tmp_path / "uses.py"
    path.write_text("from helpers_for_custom import VALUE\n\n\ndef f(run, data):\n    return VALUE\n", encoding="utf-8")
    assert custom(path, "f", ["three"]).evaluate(make_classifier(IDENTITY), make_ctx()).values == {"three": 3.0}


def test_config_checks_metric_names(metric_file) -> None:
    with pytest.raises(pydantic.ValidationError, match="letters, digits"):
        custom(metric_file, "f", ["top-1"])
    with pytest.raises(pydantic.ValidationError, match="distinct"):
        custom(metric_file, "f", ["a", "a"])
    with pytest.raises(pydantic.ValidationError):
        custom(metric_file, "f", [])
    assert Custom.metrics == ()
    assert references(Custom.Config)[RefKind.FILE] == ("file",)
    assert references(Custom.Config)[RefKind.DATASET] == ("data",)
