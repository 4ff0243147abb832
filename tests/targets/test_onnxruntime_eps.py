"""The execution provider catalog, the placement check and TensorRT's cache folder, on the CPU
build of onnxruntime (AzureExecutionProvider + CPUExecutionProvider)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pydantic
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.core.artifact import ModelArtifact
from engine.core.errors import TargetUnavailable
from targets.onnxruntime import CPU, CUDA, TENSORRT, OnnxRuntimeTarget, catalog_report, eps, placement
from targets.onnxruntime import tensorrt as trt

AZURE = "AzureExecutionProvider"


def make_target(**options: object) -> OnnxRuntimeTarget:
    return OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="t", runtime="onnxruntime", **options))


@pytest.fixture
def two_node_model(tmp_path: Path) -> ModelArtifact:
    """y = relu(x * 3): two nodes."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "three"], ["m"], name="mul"), helper.make_node("Relu", ["m"], ["y"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(np.array(3.0, dtype=np.float32), "three")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    folder = tmp_path / "m"
    folder.mkdir()
    onnx.save_model(model, str(folder / "model.onnx"))
    return ModelArtifact.from_folder("onnx", folder)


# -- catalog and config -------------------------------------------------------------------------


def test_aliases_become_full_names_before_the_fingerprint() -> None:
    by_alias = make_target(providers=["cuda", "cpu"])
    by_name = make_target(providers=[CUDA, CPU])
    assert by_alias.config.providers == [CUDA, CPU]
    assert by_alias.fingerprint() == by_name.fingerprint()
    assert make_target(providers=["tensorrt"]).config.providers == [TENSORRT]


@pytest.mark.parametrize(
    ("written", "meant"),
    [("CudaExecutionProvider", CUDA), ("tensorrt_ep", TENSORRT), ("trt", TENSORRT), ("directml", "DmlExecutionProvider")],
)
def test_a_near_miss_is_an_error_with_did_you_mean(written: str, meant: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=f"did you mean '{meant}'"):
        make_target(providers=[written])


def test_a_word_that_is_no_provider_is_an_error_listing_the_aliases() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"alias.*cuda.*tensorrt"):
        make_target(providers=["fast"])


def test_a_plugin_ep_is_declared_by_its_full_name() -> None:
    target = make_target(providers=["ExampleVendorExecutionProvider", "cpu"])
    assert target.config.providers == ["ExampleVendorExecutionProvider", CPU]
    availability = target.availability()
    assert not availability.ok and "onnxruntime-ep-" in availability.reason


def test_a_provider_listed_twice_is_an_error() -> None:
    with pytest.raises(pydantic.ValidationError, match="more than once"):
        make_target(providers=["cpu", CPU])


def test_device_kinds_derive_the_default_providers(monkeypatch: pytest.MonkeyPatch) -> None:
    assert make_target(device="cuda").config.providers == [CUDA, CPU]
    monkeypatch.setattr("platform.system", lambda: "Linux")
    assert make_target(device="gpu").config.providers == [CUDA, CPU]
    assert make_target(device="npu").config.providers == ["QNNExecutionProvider", CPU]
    monkeypatch.setattr("platform.system", lambda: "Windows")
    assert make_target(device="gpu").config.providers == ["DmlExecutionProvider", CPU]


def test_new_fields_at_their_defaults_stay_out_of_the_fingerprint() -> None:
    options = make_target().fingerprint()["options"]
    assert not {"allow_fallback", "min_ep_coverage", "tensorrt"} & set(options)
    assert make_target(allow_fallback=True).fingerprint()["options"]["allow_fallback"] is True
    assert make_target(min_ep_coverage=0.5).fingerprint() != make_target().fingerprint()


def test_min_ep_coverage_is_a_share() -> None:
    with pytest.raises(pydantic.ValidationError):
        make_target(min_ep_coverage=1.5)


def test_tensorrt_options_need_the_tensorrt_provider_and_are_typed() -> None:
    with pytest.raises(pydantic.ValidationError, match="TensorrtExecutionProvider"):
        make_target(providers=["cuda"], tensorrt={"fp16": True})
    with pytest.raises(pydantic.ValidationError):
        make_target(providers=["tensorrt", "cuda"], tensorrt={"fp17": True})
    target = make_target(providers=["tensorrt", "cuda", "cpu"], tensorrt={"fp16": True})
    assert target.fingerprint()["options"]["tensorrt"]["fp16"] is True


# -- why an EP is unavailable here ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("alias", "named"),
    [
        ("cuda", ["onnxruntime-gpu", "nvidia-smi"]),
        ("tensorrt", ["onnxruntime-gpu", "tensorrt"]),
        ("dml", ["onnxruntime-directml", "Windows only"]),
        ("coreml", ["macOS only"]),
        ("nnapi", ["Android only"]),
        ("qnn", ["onnxruntime-qnn", "Qualcomm"]),
        ("webgpu", ["onnxruntime-ep-webgpu"]),
        ("tensorrt_rtx", ["onnxruntime-ep-nv-tensorrt-rtx", "NVIDIA"]),
        ("migraphx", ["onnxruntime-migraphx", "ROCm"]),
        ("rocm", ["onnxruntime-rocm"]),
        ("vitisai", ["Ryzen AI", "Windows"]),
        ("openvino", ["onnxruntime-ep-openvino", "onnxruntime-openvino", "`environment:`"]),
    ],
)
def test_an_unavailable_ep_names_what_is_missing(alias: str, named: list[str]) -> None:
    availability = make_target(providers=[alias]).availability()
    assert not availability.ok
    for word in named:
        assert word in availability.reason


def test_tensorrt_names_libnvinfer_when_the_gpu_is_there_but_tensorrt_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eps, "nvidia_problem", lambda: None)
    assert "libnvinfer" in (eps._tensorrt_problem() or "")


def test_a_plugin_distribution_is_found_registered_and_told_to_offer_no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    module = SimpleNamespace(get_ep_names=lambda: ["ExampleVendorExecutionProvider"], get_library_path=lambda: "/nowhere/lib.so")
    registered: list[tuple[str, str]] = []
    fake_ort = SimpleNamespace(
        __version__="1.31.1",
        get_available_providers=lambda: [CPU],
        register_execution_provider_library=lambda name, path: registered.append((name, path)),
        get_ep_devices=lambda: [SimpleNamespace(ep_name=CPU)],
    )
    monkeypatch.setattr(eps, "plugin_distributions", lambda: [eps.PluginEp("onnxruntime-ep-example", "0.1", "example_ep")])
    monkeypatch.setattr(eps.importlib, "import_module", lambda name: module)
    monkeypatch.setattr(eps, "_registered", {})
    problem = eps.availability_of(fake_ort, "ExampleVendorExecutionProvider")
    assert registered == [("ExampleVendorExecutionProvider", "/nowhere/lib.so")]
    assert problem is not None and "onnxruntime-ep-example 0.1" in problem and "no device" in problem
    fake_ort.get_ep_devices = lambda: [SimpleNamespace(ep_name="ExampleVendorExecutionProvider")]
    assert eps.availability_of(fake_ort, "ExampleVendorExecutionProvider") is None


def test_the_catalog_report_lists_every_ep_with_its_state() -> None:
    rows = {name.split()[0]: (ok, why) for name, ok, why in catalog_report()}
    assert rows[CPU][0] is True
    assert rows[CUDA] == (False, rows[CUDA][1]) and "onnxruntime-gpu" in rows[CUDA][1]
    assert {ep.name for ep in eps.CATALOG} <= set(rows)
    assert OnnxRuntimeTarget.host_report() == catalog_report()


# -- no silent fallback ---------------------------------------------------------------------------


def test_a_first_choice_ep_that_takes_no_node_fails_with_the_reason(two_node_model: ModelArtifact) -> None:
    target = make_target(providers=["azure", "cpu"])
    assert target.availability().ok  # the EP exists in this build: only the session can tell
    with pytest.raises(TargetUnavailable, match=f"{AZURE}.*took no node.*{CPU} 2 nodes.*allow_fallback: true"):
        target.open_session(two_node_model)


def test_allow_fallback_keeps_the_session_and_records_placement(two_node_model: ModelArtifact) -> None:
    session = make_target(providers=["azure", "cpu"], allow_fallback=True).open_session(two_node_model)
    assert session.details["placement"] == {CPU: 2}
    assert session.details["ep_coverage"] == 0.0
    (y,) = session.run({"x": np.ones((1, 4), dtype=np.float32)})
    np.testing.assert_allclose(y, 3.0)


def test_the_cpu_target_records_full_placement(two_node_model: ModelArtifact) -> None:
    session = make_target(min_ep_coverage=1.0).open_session(two_node_model)
    assert session.details["placement"] == {CPU: 2}
    assert session.details["ep_coverage"] == 1.0


def test_cpu_fallback_is_disabled_when_the_cpu_ep_is_not_listed(two_node_model: ModelArtifact) -> None:
    options = make_target(providers=["azure"]).session_options()
    assert options.get_session_config_entry(placement.DISABLE_CPU_FALLBACK) == "1"
    with pytest.raises(TargetUnavailable, match=r"CPU fallback is off.*add CPUExecutionProvider"):
        make_target(providers=["azure"]).open_session(two_node_model)
    # listing the CPU EP, or allowing fallback, leaves onnxruntime's fallback alone
    for target in (make_target(providers=["azure", "cpu"]), make_target(providers=["azure"], allow_fallback=True)):
        assert target.session_options().get_session_config_entry(placement.RECORD_ASSIGNMENT) == "1"
        with pytest.raises(Exception):  # noqa: B017 - onnxruntime raises on a missing entry
            target.session_options().get_session_config_entry(placement.DISABLE_CPU_FALLBACK)


def test_coverage_below_the_minimum_fails_with_the_figures() -> None:
    with pytest.raises(TargetUnavailable, match="took 25% of the nodes, below min_ep_coverage 50%"):
        placement.check("t", [CUDA, CPU], [CUDA, CPU], {CUDA: 1, CPU: 3}, 0.5)
    placement.check("t", [CUDA, CPU], [CUDA, CPU], {CUDA: 3, CPU: 1}, 0.5)


def test_a_dropped_first_choice_fails_naming_what_took_the_nodes() -> None:
    with pytest.raises(TargetUnavailable, match=f"did not load {TENSORRT}.*in use: {CUDA}, {CPU}.*{CUDA} 5 nodes"):
        placement.check("t", [TENSORRT, CUDA, CPU], [CUDA, CPU], {CUDA: 5}, None)


# -- TensorRT's cache folder ---------------------------------------------------------------------

H100 = {"name": "NVIDIA H100 80GB HBM3", "compute_cap": "9.0", "driver": "580.1", "uuid": "GPU-1"}
L4 = {"name": "NVIDIA L4", "compute_cap": "8.9", "driver": "580.1", "uuid": "GPU-2"}
VERSIONS = {"onnxruntime": "1.31.1", "tensorrt": "10.9"}


def test_the_tensorrt_cache_key_is_per_model_options_gpu_and_versions() -> None:
    options = trt.TensorRTOptions(fp16=True)
    key = trt.cache_key("abc", options, H100, VERSIONS)
    assert key == trt.cache_key("abc", trt.TensorRTOptions(fp16=True), dict(H100), dict(VERSIONS))
    assert key != trt.cache_key("abc", options, L4, VERSIONS)
    assert key != trt.cache_key("abd", options, H100, VERSIONS)
    assert key != trt.cache_key("abc", trt.TensorRTOptions(fp16=True, int8=True), H100, VERSIONS)
    assert key != trt.cache_key("abc", options, H100, {**VERSIONS, "tensorrt": "10.10"})
    assert trt.cache_folder(Path("/s"), key) == Path("/s/tensorrt") / key


def test_tensorrt_options_map_to_provider_options(tmp_path: Path) -> None:
    mapped = trt.provider_options(trt.TensorRTOptions(fp16=True, builder_optimization_level=5), tmp_path)
    assert mapped["trt_fp16_enable"] == "True" and mapped["trt_int8_enable"] == "False"
    assert mapped["trt_engine_cache_path"] == str(tmp_path / "engines")
    assert mapped["trt_timing_cache_path"] == str(tmp_path / "timing")
    assert mapped["trt_builder_optimization_level"] == "5"
    assert "trt_engine_cache_enable" not in trt.provider_options(trt.TensorRTOptions(), None)


def test_the_cache_folder_is_made_under_the_targets_cache_dir(
    tmp_path: Path, two_node_model: ModelArtifact, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trt, "gpu_identity", lambda device_id=0: H100)
    target = make_target(providers=["tensorrt", "cuda", "cpu"], tensorrt={"fp16": True}, provider_options=[{"device_id": 0}, {}, {}])
    assert target.provider_options_for(two_node_model, "1.31.1")[0].get("trt_engine_cache_path") is None  # no cache_dir: no cache
    target.cache_dir = tmp_path
    options = target.provider_options_for(two_node_model, "1.31.1")
    engines = Path(options[0]["trt_engine_cache_path"])
    assert engines.is_dir() and engines.parent.parent == tmp_path / "tensorrt"
    assert options[0]["device_id"] == 0 and options[1] == {}


@pytest.mark.skipif(not eps.plugin_distributions(), reason="no onnxruntime-ep-* package installed here")
def test_installed_plugin_eps_register_and_say_whether_they_offer_a_device() -> None:
    import onnxruntime

    registered = eps.register_plugins(onnxruntime)
    assert registered, "an onnxruntime-ep-* package is installed but registered no EP"
    for name, distribution in registered.items():
        problem = eps.availability_of(onnxruntime, name)
        assert problem is None or distribution in problem
