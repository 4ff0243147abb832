"""The OpenVINO target on real OpenVINO: availability, session specs, the precision in force."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import openvino as ov
import pydantic
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.core.artifact import ModelArtifact
from engine.core.errors import KilnError, TargetUnavailable
from targets.openvino import OpenVinoTarget, model_precision_hint, set_model_precision_hint

#: what this CPU runs FP32 models in when nobody says (bf16 on CPUs with AVX-512 BF16 or AMX)
CPU_DEFAULT = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()


def save(model: onnx.ModelProto, folder: Path) -> ModelArtifact:
    model.ir_version = 10
    onnx.checker.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(folder / "model.onnx"))
    return ModelArtifact.from_folder("onnx", folder)


def mlp_onnx(folder: Path) -> ModelArtifact:
    """x [batch, 8] -> MatMul -> Add -> Relu (relu_out [batch, 16]) -> MatMul -> y [batch, 4]."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h1"]),
            helper.make_node("Add", ["h1", "b1"], ["h2"]),
            helper.make_node("Relu", ["h2"], ["relu_out"]),
            helper.make_node("MatMul", ["relu_out", "w2"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("relu_out", TensorProto.FLOAT, ["batch", 16]),
        ],
        initializer=[
            numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1"),
            numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1"),
            numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w2"),
        ],
    )
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder)


def mlp_reference(folder: Path, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    weights = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in onnx.load(str(folder / "model.onnx")).graph.initializer}
    relu = np.maximum(x.astype(np.float64) @ weights["w1"] + weights["b1"], 0)
    return relu @ weights["w2"], relu


def embedding_onnx(folder: Path) -> ModelArtifact:
    """input_ids [batch, sequence] int64, mask [2, 3] bool -> Gather -> hidden [batch, sequence, 6]; mask passed through."""
    table = np.arange(60, dtype=np.float32).reshape(10, 6)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["hidden"]), helper.make_node("Identity", ["mask"], ["mask_out"])],
        "embed",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, [2, 3]),
        ],
        [
            helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "sequence", 6]),
            helper.make_tensor_value_info("mask_out", TensorProto.BOOL, [2, 3]),
        ],
        initializer=[numpy_helper.from_array(table, "table")],
    )
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder)


def make_target(**options: object) -> OpenVinoTarget:
    return OpenVinoTarget(OpenVinoTarget.Config(id="ov", runtime="openvino", **options))


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> ModelArtifact:
    return mlp_onnx(tmp_path_factory.mktemp("mlp"))


def ir_with_hint(source: ModelArtifact, folder: Path, hint: str | None) -> ModelArtifact:
    model = ov.Core().read_model(str(source.model_file))
    set_model_precision_hint(model, hint)
    folder.mkdir(parents=True)
    ov.save_model(model, str(folder / "model.xml"), compress_to_fp16=False)
    return ModelArtifact.from_folder("openvino", folder)


def test_cpu_target_is_available() -> None:
    availability = make_target().availability()
    assert availability.ok, availability.reason


def test_absent_device_is_unavailable_with_a_reason_listing_the_devices_present() -> None:
    present = ov.Core().available_devices
    if any(name.startswith("NPU") for name in present):
        pytest.skip("this machine has an NPU")
    availability = make_target(device="NPU").availability()
    assert not availability.ok
    assert "no NPU device" in availability.reason
    assert "devices present: CPU" in availability.reason


def test_opening_a_session_on_an_absent_device_raises_target_unavailable(mlp: ModelArtifact) -> None:
    if any(name.startswith("NPU") for name in ov.Core().available_devices):
        pytest.skip("this machine has an NPU")
    with pytest.raises(TargetUnavailable, match="no NPU device"):
        make_target(device="NPU").open_session(mlp)


def test_device_names_are_case_insensitive_and_default_to_cpu() -> None:
    assert make_target().config.device == "CPU"
    assert make_target(device="cpu").config.device == "CPU"
    assert make_target(device="auto").config.device == "AUTO"


def test_config_rejects_unknown_keys_devices_and_hints() -> None:
    with pytest.raises(pydantic.ValidationError):
        make_target(threads=2)
    with pytest.raises(pydantic.ValidationError):
        make_target(device="TPU")
    with pytest.raises(pydantic.ValidationError):
        make_target(inference_precision_hint="int8")


def test_session_specs_have_numpy_dtypes_static_dims_and_none_for_dynamic_ones(tmp_path: Path) -> None:
    session = make_target().open_session(embedding_onnx(tmp_path / "embed"))
    assert [(s.name, s.dtype, s.shape) for s in session.inputs] == [("input_ids", "int64", (None, None)), ("mask", "bool", (2, 3))]
    assert [(s.name, s.dtype, s.shape) for s in session.outputs] == [("hidden", "float32", (None, None, 6)), ("mask_out", "bool", (2, 3))]
    hidden, mask = session.run({"input_ids": np.array([[1, 2, 3]], np.int64), "mask": np.ones((2, 3), bool)})
    np.testing.assert_array_equal(hidden[0, 1], np.arange(12, 18))
    assert mask.dtype == np.bool_


def test_run_returns_outputs_in_declared_order_matching_numpy(mlp: ModelArtifact) -> None:
    session = make_target().open_session(mlp)
    assert [spec.name for spec in session.outputs] == ["y", "relu_out"]
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    y, relu = session.run({"x": x})
    want_y, want_relu = mlp_reference(mlp.path, x)
    np.testing.assert_allclose(y, want_y, atol=1e-4)
    np.testing.assert_allclose(relu, want_relu, atol=1e-4)


def test_onnx_model_without_hint_runs_at_the_reference_precision_f32(mlp: ModelArtifact) -> None:
    details = make_target().open_session(mlp).details
    assert details["inference_precision_hint"] == "f32"  # read back from the compiled model
    assert details["precision_hint_source"] == "reference_precision_hint"
    assert details["model_precision_hint"] is None


def test_without_any_hint_the_device_default_is_in_force_and_recorded(mlp: ModelArtifact) -> None:
    details = make_target(reference_precision_hint=None).open_session(mlp).details
    assert details["precision_hint_requested"] is None
    assert details["precision_hint_source"] == "device_default"
    assert details["inference_precision_hint"] == CPU_DEFAULT


@pytest.mark.skipif(CPU_DEFAULT != "bf16", reason="this CPU runs FP32 models in f32 by default")
def test_bf16_default_changes_the_outputs_and_f32_does_not(mlp: ModelArtifact) -> None:
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    want, _ = mlp_reference(mlp.path, x)
    f32 = make_target().open_session(mlp).run({"x": x})[0]
    bf16 = make_target(reference_precision_hint=None).open_session(mlp).run({"x": x})[0]
    assert np.abs(f32 - want).max() < 1e-4
    assert np.abs(bf16 - want).max() > 1e-3  # bf16 keeps 8 bits of mantissa


def test_model_carried_hint_is_applied(mlp: ModelArtifact, tmp_path: Path) -> None:
    model = ir_with_hint(mlp, tmp_path / "bf16", "bf16")
    assert model_precision_hint(ov.Core().read_model(str(model.model_file))) == "bf16"
    details = make_target().open_session(model).details
    assert details["model_precision_hint"] == "bf16"
    assert details["precision_hint_source"] == "model"
    assert details["precision_hint_requested"] == "bf16"
    if CPU_DEFAULT == "bf16":  # a CPU without BF16 would fall back, and say so
        assert details["inference_precision_hint"] == "bf16"


def test_a_model_asking_for_the_device_default_gets_no_hint(mlp: ModelArtifact, tmp_path: Path) -> None:
    model = ir_with_hint(mlp, tmp_path / "device", "device")
    details = make_target().open_session(model).details  # reference_precision_hint f32 must not apply
    assert details["model_precision_hint"] == "device"
    assert details["precision_hint_source"] == "model: device default"
    assert details["precision_hint_requested"] is None
    assert details["inference_precision_hint"] == CPU_DEFAULT


def test_target_hint_overrides_the_model_hint(mlp: ModelArtifact, tmp_path: Path) -> None:
    model = ir_with_hint(mlp, tmp_path / "bf16", "bf16")
    details = make_target(inference_precision_hint="f32").open_session(model).details
    assert details["inference_precision_hint"] == "f32"
    assert details["precision_hint_source"] == "target"
    assert details["model_precision_hint"] == "bf16"


def test_ir_without_hint_gets_the_reference_hint(mlp: ModelArtifact, tmp_path: Path) -> None:
    model = ir_with_hint(mlp, tmp_path / "plain", None)
    details = make_target(reference_precision_hint="bf16").open_session(model).details
    assert details["precision_hint_requested"] == "bf16"
    assert details["precision_hint_source"] == "reference_precision_hint"


def test_removing_a_hint_leaves_no_runtime_options(mlp: ModelArtifact) -> None:
    model = ov.Core().read_model(str(mlp.model_file))
    set_model_precision_hint(model, "f16")
    set_model_precision_hint(model, None)
    assert model_precision_hint(model) is None
    assert not model.has_rt_info("runtime_options")


def test_details_record_version_device_hint_streams_and_threads(mlp: ModelArtifact) -> None:
    details = make_target(inference_num_threads=1, performance_hint="LATENCY").open_session(mlp).details
    assert details["openvino_version"] == ov.__version__
    assert details["device"] == "CPU"
    assert details["execution_devices"] == ["CPU"]
    assert details["performance_hint"] == "LATENCY"
    assert details["inference_num_threads"] == 1
    assert details["num_streams"] == 1
    assert details["compile_config"] == {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": "1", "INFERENCE_PRECISION_HINT": "f32"}


def test_throughput_hint_is_in_force(mlp: ModelArtifact) -> None:
    details = make_target(performance_hint="THROUGHPUT").open_session(mlp).details
    assert details["performance_hint"] == "THROUGHPUT"


def test_auto_device_runs_and_records_the_requested_hint(mlp: ModelArtifact) -> None:
    session = make_target(device="AUTO").open_session(mlp)
    assert session.details["execution_devices"]  # AUTO says where it runs
    assert session.details["precision_hint"] == "f32"  # AUTO does not report it: the requested one is recorded
    (y, _) = session.run({"x": np.ones((1, 8), np.float32)})
    assert y.shape == (1, 4)


def test_a_closed_session_refuses_to_run(mlp: ModelArtifact) -> None:
    session = make_target().open_session(mlp)
    session.close()
    with pytest.raises(KilnError, match="closed"):
        session.run({"x": np.zeros((1, 8), np.float32)})


def test_a_bad_feed_is_a_kiln_error(mlp: ModelArtifact) -> None:
    session = make_target().open_session(mlp)
    with pytest.raises(KilnError, match="openvino failed to run"):
        session.run({"x": np.zeros((1, 5), np.float32)})


def test_a_corrupt_model_file_is_a_kiln_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "model.xml").write_text("<net>not a model")
    with pytest.raises(KilnError, match="could not read"):
        make_target().open_session(ModelArtifact.from_folder("openvino", tmp_path))


def test_a_hugging_face_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(KilnError, match="runs OpenVINO IR and ONNX models"):
        make_target().open_session(ModelArtifact.from_folder("hf", tmp_path))


def test_fingerprint_leaves_out_the_id_and_includes_the_precision_options() -> None:
    first = OpenVinoTarget(OpenVinoTarget.Config(id="a", runtime="openvino")).fingerprint()
    second = OpenVinoTarget(OpenVinoTarget.Config(id="b", runtime="openvino", device="cpu")).fingerprint()
    pinned = OpenVinoTarget(OpenVinoTarget.Config(id="a", runtime="openvino", inference_precision_hint="bf16")).fingerprint()
    assert first == second
    assert first != pinned
    assert first["libraries"]["openvino"]
    assert first["options"]["reference_precision_hint"] == "f32"


# -- session settings, prepared runs, concurrency, inference settings -------------------------


def test_scheduling_fields_are_left_out_of_the_keys_until_set() -> None:
    data = make_target().config.to_json()
    for name in ("enable_hyper_threading", "enable_cpu_pinning", "scheduling_core_type"):
        assert name not in data
    tuned = make_target(enable_cpu_pinning=False, scheduling_core_type="ANY_CORE").config.to_json()
    assert tuned["enable_cpu_pinning"] is False and tuned["scheduling_core_type"] == "ANY_CORE"
    with pytest.raises(pydantic.ValidationError, match="PCORE_ONLY"):
        make_target(scheduling_core_type="BIG")


def test_scheduling_options_reach_compile_model_and_the_details(mlp: ModelArtifact) -> None:
    session = make_target(
        enable_cpu_pinning=False, scheduling_core_type="ANY_CORE", num_streams=2, performance_hint="THROUGHPUT"
    ).open_session(mlp)
    config = session.details["compile_config"]
    assert config["ENABLE_CPU_PINNING"] == "False" and config["SCHEDULING_CORE_TYPE"] == "ANY_CORE" and config["NUM_STREAMS"] == "2"
    assert session.details["enable_cpu_pinning"] is False
    assert session.details["scheduling_core_type"] == "ANY_CORE"
    assert session.details["num_streams"] == 2
    assert session.details["io_binding"] == "off"


def test_a_prepared_run_sets_the_inputs_once_and_only_infers(mlp: ModelArtifact) -> None:
    session = make_target().open_session(mlp)
    x = np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32)
    expected = session.run({"x": x})
    call = session.prepare({"x": x})
    session.synchronize()
    for _ in range(3):
        assert call() is None
    assert session.details["io_binding"] == "device"
    assert "CPU" in session.details["io_binding_note"]
    request = call.request  # type: ignore[attr-defined]
    np.testing.assert_allclose(request.get_output_tensor(0).data, expected[0], rtol=1e-6)
    session.run({"x": np.zeros((5, 8), np.float32)})  # the session's own request does not disturb the prepared one
    call()
    np.testing.assert_allclose(request.get_output_tensor(0).data, expected[0], rtol=1e-6)


def test_prepare_refuses_an_unknown_input(mlp: ModelArtifact) -> None:
    session = make_target().open_session(mlp)
    with pytest.raises(KilnError, match="no input 'nope'"):
        session.prepare({"nope": np.ones((1, 8), np.float32)})


def test_concurrent_runs_use_requests_of_their_own(mlp: ModelArtifact) -> None:
    import threading

    session = make_target(performance_hint="THROUGHPUT").open_session(mlp)
    errors: list[BaseException] = []

    def serve(seed: int) -> None:
        run = session.concurrent()
        try:
            for step in range(20):
                x = np.random.default_rng(seed * 100 + step).standard_normal((2, 8)).astype(np.float32)
                y, _ = run({"x": x})
                expected_y, _ = mlp_reference(Path(mlp.model_file).parent, x)
                np.testing.assert_allclose(y, expected_y, rtol=1e-4, atol=1e-4)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=serve, args=(seed,)) for seed in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    session.close()
    with pytest.raises(KilnError, match="closed"):
        session.concurrent()


def test_inference_settings_and_the_snippet_compile_the_model_as_measured(mlp: ModelArtifact) -> None:
    target = make_target(inference_num_threads=1, num_streams=1, enable_cpu_pinning=False)
    session = target.open_session(mlp)
    session.prepare({"x": np.ones((1, 8), np.float32)})
    settings = target.inference_settings(session.details)
    import json

    json.dumps(settings)
    assert settings["runtime"] == "openvino" and settings["device"] == "CPU"
    assert settings["compile_config"] == session.details["compile_config"]
    assert settings["in_force"]["inference_num_threads"] == 1
    assert settings["in_force"]["inference_precision_hint"] == "f32"
    assert settings["io_binding"]["mode"] == "device"
    code = target.snippet(settings, str(mlp.model_file))
    namespace: dict[str, object] = {}
    exec(compile(code, "snippet", "exec"), namespace)
    compiled = namespace["compiled"]
    assert compiled.get_property("INFERENCE_NUM_THREADS") == 1  # type: ignore[attr-defined]
    assert compiled.get_property("ENABLE_CPU_PINNING") is False  # type: ignore[attr-defined]
    assert compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name() == "f32"  # type: ignore[attr-defined]
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    results = namespace["request"].infer({"x": x})  # type: ignore[attr-defined]
    np.testing.assert_allclose(results[compiled.outputs[0]], session.run({"x": x})[0], rtol=1e-6)  # type: ignore[attr-defined]
