"""A model no runtime can load is refused: the input at validation (exit 2), a candidate before
it can be chosen, and the size evaluator does not count bytes that are not there."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper, numpy_helper

from engine.cli.main import main
from engine.core.loadable import onnx_load_problem
from tests.engine.engine_helpers import tiny_workflow, write_workflow


def _custom_domain_model(path):
    node = helper.make_node("Mystery", ["x"], ["y"], domain="com.example.unknown")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example.unknown", 1)])
    onnx.save(model, str(path))
    return path


def _external_data_model(folder):
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    weight = numpy_helper.from_array(np.ones((4, 4), dtype=np.float32), name="w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(
        model,
        str(folder / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    return folder / "model.onnx"


def test_unknown_domains_and_missing_external_data_are_load_problems(tmp_path):
    assert "com.example.unknown" in onnx_load_problem(_custom_domain_model(tmp_path / "custom.onnx"))
    model = _external_data_model(tmp_path / "ext")
    assert onnx_load_problem(model) is None
    (tmp_path / "ext" / "weights.bin").unlink()
    assert "weights.bin" in onnx_load_problem(model) and "missing" in onnx_load_problem(model)


def test_validate_refuses_an_input_no_runtime_can_load(tmp_path, capsys):
    custom = write_workflow(tmp_path / "a", tiny_workflow(_custom_domain_model(tmp_path / "custom.onnx")))
    model = _external_data_model(tmp_path / "ext")
    (tmp_path / "ext" / "weights.bin").unlink()
    missing = write_workflow(tmp_path / "b", tiny_workflow(model))
    assert main(["validate", str(custom)]) == 2
    assert "com.example.unknown" in capsys.readouterr().err
    assert main(["validate", str(missing)]) == 2
    assert "weights.bin" in capsys.readouterr().err


def test_the_size_evaluator_reports_missing_external_data_as_an_error(tmp_path):
    import pytest

    from engine.core.artifact import ModelArtifact
    from engine.core.errors import EvaluationError
    from evaluators.size import Size

    model = _external_data_model(tmp_path / "ext")
    (tmp_path / "ext" / "weights.bin").unlink()
    artifact = ModelArtifact(format="onnx", path=tmp_path / "ext", digest="0" * 64)
    with pytest.raises(EvaluationError, match=r"weights\.bin"):
        Size(Size.Config()).evaluate(artifact, None)  # type: ignore[arg-type]
    assert model.is_file()


def _newer_ir_model(path):
    """A model onnx writes and checks but onnxruntime refuses to load: the IR version of the
    installed onnx, newer than the installed onnxruntime reads (a static check cannot know which
    onnxruntime a target runs)."""
    import onnxruntime
    import pytest

    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = onnx.IR_VERSION
    onnx.save(model, str(path))
    try:
        onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - what this model is for
        return path
    pytest.skip(f"this onnxruntime loads IR version {onnx.IR_VERSION}: no model of that kind to try")


def _size_only(model, name="size"):
    return tiny_workflow(
        model,
        steps=[],
        evaluate=[{"id": name, "evaluator": "size"}],
        select={"objective": {"metric": f"{name}.file_bytes", "goal": "min"}},
    )


def test_a_size_only_search_opens_each_candidate_on_its_target_before_it_can_be_chosen(tmp_path, tiny_onnx):
    from engine.run import run_workflow
    from engine.store.store import Store
    from engine.workflow import load_workflow

    # loadable: chosen, with the time its session took to open
    report = run_workflow(load_workflow(write_workflow(tmp_path / "ok", _size_only(tiny_onnx))), Store(tmp_path / "store"))
    (chosen,) = report.chosen().values()
    assert chosen.metrics["load.open_s"] > 0 and chosen.details["load"]["runtime"] == "onnxruntime"

    # the static check passes it; onnxruntime refuses it: failed, never chosen
    model = _newer_ir_model(tmp_path / "newer-ir.onnx")
    assert onnx_load_problem(model) is None
    report = run_workflow(load_workflow(write_workflow(tmp_path / "bad", _size_only(model))), Store(tmp_path / "store"))
    assert report.chosen() == {}
    (result,) = report.results
    assert result.state == "failed" and "could not open the model on target 'cpu'" in result.reason
    assert "IR version" in result.reason and "onnxruntime_src" not in result.reason  # the reason, not the C++ location


def test_load_keeps_its_name_where_a_workflow_evaluation_has_it_and_is_not_added_where_a_session_opens(tmp_path, tiny_onnx):
    from engine.execute.evaluation import candidate_evaluations
    from engine.workflow import load_workflow

    taken = _size_only(tiny_onnx, name="load")
    specs = candidate_evaluations(load_workflow(write_workflow(tmp_path / "a", taken)))
    assert [(s.id, s.plugin) for s in specs] == [("load", "size"), ("load_check", "load")]
    timed = candidate_evaluations(load_workflow(write_workflow(tmp_path / "b", tiny_workflow(tiny_onnx))))
    assert "load" not in {s.plugin for s in timed}
