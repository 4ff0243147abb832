"""References are found by walking a Config's field types."""

from __future__ import annotations

from typing import Literal

from engine import registry
from engine.core import StrictConfig
from engine.core.refs import (
    CodePath,
    DatasetRef,
    EvaluationRef,
    FileOrInput,
    FilePath,
    InputModelField,
    InputTask,
    RefKind,
    reference_fields,
    referenced,
    references,
)


class Options(StrictConfig):
    data: DatasetRef
    extra: list[str] = []
    calibration: DatasetRef | None = None
    judge: EvaluationRef | None = None
    weights: FilePath | None = None
    code: CodePath | None = None
    tokenizer: FileOrInput = "input"
    heads: InputModelField[int | None] = None
    task: InputTask[Literal["a", "b"]] = "a"


def test_references_are_found_by_type_through_optional_and_generic_aliases() -> None:
    assert references(Options) == {
        RefKind.DATASET: ("data", "calibration"),
        RefKind.EVALUATION: ("judge",),
        RefKind.FILE: ("weights", "code", "tokenizer"),
        RefKind.INPUT_MODEL: ("heads",),
        RefKind.TASK: ("task",),
    }
    fields = reference_fields(Options)
    assert fields["code"].code and not fields["weights"].code
    assert fields["tokenizer"].sentinels == ("input",)


def test_referenced_values_skip_sentinels_unset_options_and_empty_paths() -> None:
    config = Options(data="rows", weights="", tokenizer="input", code="m.py")
    assert referenced(Options, config, RefKind.DATASET) == {"data": "rows"}
    assert referenced(Options, config.to_json(), RefKind.FILE) == {"code": "m.py"}
    assert referenced(Options, {"tokenizer": "tok"}, RefKind.FILE) == {"tokenizer": "tok"}


def test_markers_leave_the_schema_as_the_plain_type() -> None:
    schema = Options.model_json_schema()["properties"]
    assert schema["data"] == {"title": "Data", "type": "string"}
    assert schema["heads"]["anyOf"] == [{"type": "integer"}, {"type": "null"}]


def test_builtin_plugins_declare_their_references_by_type() -> None:
    load = registry.load
    assert references(load("passes", "ort_fusion").Config)[RefKind.INPUT_MODEL] == ("num_heads", "hidden_size")
    assert references(load("passes", "torch_export").Config)[RefKind.TASK] == ("task",)
    assert references(load("passes", "nncf_compress_weights").Config)[RefKind.DATASET] == ("dataset",)
    assert references(load("evaluators", "fidelity").Config)[RefKind.DATASET] == ("data",)
    assert references(load("evaluators", "latency").Config)[RefKind.DATASET] == ("data",)
    assert reference_fields(load("evaluators", "custom").Config)["file"].code
    assert references(load("datasources", "npz").Config)[RefKind.FILE] == ("path",)
    assert RefKind.FILE not in references(load("datasources", "synthetic").Config)


def test_types_are_shown_without_their_markers() -> None:
    from engine.core.refs import without_markers

    fields = Options.model_fields
    assert str(without_markers(fields["calibration"].annotation)) == "str | None"
    assert without_markers(fields["extra"].annotation) == list[str]  # nothing to take off


def test_the_input_task_fills_only_the_options_typed_input_task() -> None:
    from engine.workflow.resolve.steps import fill_from_workflow

    export, fusion = registry.load("passes", "torch_export"), registry.load("passes", "ort_fusion")
    values: dict[str, object] = {}
    assert fill_from_workflow(export, values, "text-classification") == {"task": "input.task"}
    assert values == {"task": "text-classification"}
    given = {"task": "feature-extraction"}
    assert fill_from_workflow(export, given, "text-classification") == {} and given == {"task": "feature-extraction"}
    assert fill_from_workflow(fusion, {}, "text-classification") == {}
