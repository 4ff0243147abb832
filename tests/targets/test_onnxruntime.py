"""The ONNX Runtime target on real onnxruntime: availability, session specs, details, errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pydantic
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.core.artifact import ModelArtifact
from engine.core.errors import KilnError, TargetUnavailable
from targets.onnxruntime import CPU, CUDA, OnnxRuntimeTarget, numpy_dtype_name

# one input per dtype the dtype mapping must get right, each passed through an Identity
DTYPES = {
    "ids": (TensorProto.INT64, ["batch", "sequence"]),
    "f32": (TensorProto.FLOAT, ["batch", 4]),
    "f16": (TensorProto.FLOAT16, [2, None]),
    "i32": (TensorProto.INT32, ["batch"]),
    "flag": (TensorProto.BOOL, [1]),
    "u8": (TensorProto.UINT8, ["batch", 3]),
    "i8": (TensorProto.INT8, [5]),
    "f64": (TensorProto.DOUBLE, [2]),
}


def make_target(**options: object) -> OnnxRuntimeTarget:
    return OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="cpu", runtime="onnxruntime", **options))


@pytest.fixture
def typed_model(tmp_path: Path) -> ModelArtifact:
    inputs, outputs, nodes = [], [], []
    for name, (elem, shape) in DTYPES.items():
        inputs.append(helper.make_tensor_value_info(name, elem, shape))
        outputs.append(helper.make_tensor_value_info(f"{name}_out", elem, shape))
        nodes.append(helper.make_node("Identity", [name], [f"{name}_out"]))
    graph = helper.make_graph(nodes, "typed", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    folder = tmp_path / "typed"
    folder.mkdir()
    onnx.save_model(model, str(folder / "model.onnx"))
    return ModelArtifact.from_folder("onnx", folder)


@pytest.fixture
def scale_model(tmp_path: Path) -> ModelArtifact:
    """y = x * 3 over x [batch, 4] float32."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "three"], ["y"])],
        "scale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(np.array(3.0, dtype=np.float32), "three")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    folder = tmp_path / "scale"
    folder.mkdir()
    onnx.save_model(model, str(folder / "model.onnx"))
    return ModelArtifact.from_folder("onnx", folder)


def test_cpu_target_is_available() -> None:
    availability = make_target().availability()
    assert availability.ok, availability.reason


def test_bogus_provider_is_unavailable_with_a_reason_naming_it_and_what_exists() -> None:
    availability = make_target(providers=["BogusExecutionProvider", CPU]).availability()
    assert not availability.ok
    assert "BogusExecutionProvider" in availability.reason
    assert CPU in availability.reason  # what is available is listed


def test_opening_a_session_on_an_unavailable_provider_raises_target_unavailable(scale_model: ModelArtifact) -> None:
    with pytest.raises(TargetUnavailable, match="BogusExecutionProvider"):
        make_target(providers=["BogusExecutionProvider"]).open_session(scale_model)


def test_default_providers_follow_the_device() -> None:
    assert make_target().config.providers == [CPU]
    assert make_target(device="cuda").config.providers == [CUDA, CPU]
    assert make_target(device="cuda", providers=[CPU]).config.providers == [CPU]


def test_provider_options_must_match_providers_one_to_one() -> None:
    with pytest.raises(pydantic.ValidationError, match="one mapping per provider"):
        make_target(providers=[CPU], provider_options=[{}, {}])


def test_config_rejects_unknown_keys_and_bad_levels() -> None:
    with pytest.raises(pydantic.ValidationError):
        make_target(threads=2)
    with pytest.raises(pydantic.ValidationError):
        make_target(graph_optimization_level="max")


@pytest.mark.parametrize(
    ("ort_type", "expected"),
    [
        ("tensor(float)", "float32"),
        ("tensor(int64)", "int64"),
        ("tensor(float16)", "float16"),
        ("tensor(bool)", "bool"),
        ("seq(tensor(float))", "seq(tensor(float))"),
    ],
)
def test_ort_type_names_map_to_numpy_dtype_names(ort_type: str, expected: str) -> None:
    assert numpy_dtype_name(ort_type) == expected


def test_session_specs_have_numpy_dtypes_and_keep_symbolic_dims(typed_model: ModelArtifact) -> None:
    session = make_target().open_session(typed_model)
    specs = {spec.name: spec for spec in session.inputs}
    assert {name: spec.dtype for name, spec in specs.items()} == {
        "ids": "int64",
        "f32": "float32",
        "f16": "float16",
        "i32": "int32",
        "flag": "bool",
        "u8": "uint8",
        "i8": "int8",
        "f64": "float64",
    }
    assert specs["ids"].shape == ("batch", "sequence")
    assert specs["f32"].shape == ("batch", 4)
    assert specs["f16"].shape == (2, None)
    assert [spec.name for spec in session.outputs] == [f"{name}_out" for name in DTYPES]
    assert session.outputs[0].dtype == "int64"
    # every dtype name is one numpy knows, so synthetic feeds can be made from it
    for spec in session.inputs:
        np.dtype(spec.dtype)


def test_run_returns_outputs_in_declared_order(scale_model: ModelArtifact) -> None:
    session = make_target().open_session(scale_model)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    (y,) = session.run({"x": x})
    np.testing.assert_allclose(y, x * 3)


def test_details_record_providers_in_use_threads_level_and_version(scale_model: ModelArtifact) -> None:
    import onnxruntime

    session = make_target(intra_op_threads=1, graph_optimization_level="basic").open_session(scale_model)
    details = session.details
    assert details["providers"] == [CPU]
    assert details["intra_op_threads"] == 1
    assert details["inter_op_threads"] is None
    assert details["graph_optimization_level"] == "basic"
    assert details["execution_mode"] == "sequential"
    assert details["onnxruntime_version"] == onnxruntime.__version__


def test_session_options_carry_the_config() -> None:
    import onnxruntime

    options = make_target(
        intra_op_threads=2, inter_op_threads=1, graph_optimization_level="extended", execution_mode="parallel"
    ).session_options()
    assert options.intra_op_num_threads == 2
    assert options.inter_op_num_threads == 1
    assert options.graph_optimization_level == onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    assert options.execution_mode == onnxruntime.ExecutionMode.ORT_PARALLEL


def test_a_closed_session_refuses_to_run(scale_model: ModelArtifact) -> None:
    session = make_target().open_session(scale_model)
    session.close()
    with pytest.raises(KilnError, match="closed"):
        session.run({"x": np.zeros((1, 4), dtype=np.float32)})


def test_a_bad_feed_is_a_kiln_error_not_a_runtime_exception(scale_model: ModelArtifact) -> None:
    session = make_target().open_session(scale_model)
    with pytest.raises(KilnError, match="onnxruntime failed to run"):
        session.run({"x": np.zeros((1, 5), dtype=np.float32)})


def test_a_corrupt_model_file_is_a_kiln_error_naming_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"not a protobuf")
    with pytest.raises(KilnError, match="could not load"):
        make_target().open_session(ModelArtifact.from_folder("onnx", folder))


def test_a_non_onnx_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(KilnError, match="runs ONNX models"):
        make_target().open_session(ModelArtifact.from_folder("hf", tmp_path))


def test_fingerprint_leaves_out_the_id_and_includes_options_and_version() -> None:
    first = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="a", runtime="onnxruntime")).fingerprint()
    renamed = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="b", runtime="onnxruntime")).fingerprint()
    threaded = make_target(intra_op_threads=1).fingerprint()
    assert first == renamed
    assert first != threaded
    assert first["libraries"]["onnxruntime"]


def test_importing_the_module_does_not_import_onnxruntime() -> None:
    code = "import sys, targets.onnxruntime; print('onnxruntime' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_the_openvino_execution_provider_is_unavailable_with_the_reason_why():
    from targets.onnxruntime import OnnxRuntimeTarget

    target = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="ort-ov", runtime="onnxruntime", providers=["OpenVINOExecutionProvider"]))
    availability = target.availability()
    assert not availability.ok
    assert "onnxruntime-openvino" in availability.reason and "`openvino` runtime" in availability.reason
