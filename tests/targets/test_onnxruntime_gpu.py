"""Execution provider placement on a real NVIDIA GPU: runs only where onnxruntime has the CUDA
execution provider and an NVIDIA GPU answers; skipped cleanly elsewhere (CI has no GPU)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.core.artifact import ModelArtifact
from targets.onnxruntime import CPU, CUDA, TENSORRT, OnnxRuntimeTarget, eps


def _cuda_available() -> bool:
    try:
        import onnxruntime
    except ImportError:
        return False
    return CUDA in onnxruntime.get_available_providers() and shutil.which("nvidia-smi") is not None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda_available(), reason="no NVIDIA GPU with onnxruntime's CUDA provider here")]


@pytest.fixture
def matmul_model(tmp_path: Path) -> ModelArtifact:
    weight = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    folder = tmp_path / "m"
    folder.mkdir()
    onnx.save_model(model, str(folder / "model.onnx"))
    return ModelArtifact.from_folder("onnx", folder)


def test_a_cuda_target_places_the_graph_on_cuda(matmul_model: ModelArtifact) -> None:
    target = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="gpu", runtime="onnxruntime", device="cuda", min_ep_coverage=0.5))
    assert target.availability().ok, target.availability().reason
    session = target.open_session(matmul_model)
    assert session.details["providers"][0] == CUDA
    assert session.details["placement"].get(CUDA, 0) >= 1
    assert session.details["ep_coverage"] >= 0.5
    x = np.ones((2, 64), dtype=np.float32)
    (y,) = session.run({"x": x})
    assert y.shape == (2, 64)


def test_cuda_without_the_cpu_ep_refuses_cpu_fallback_and_still_runs(matmul_model: ModelArtifact) -> None:
    target = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="gpu", runtime="onnxruntime", providers=["cuda"]))
    session = target.open_session(matmul_model)
    assert set(session.details["placement"]) == {CUDA}
    assert session.details["ep_coverage"] == 1.0


def test_tensorrt_keeps_its_engine_in_the_cache_dir(tmp_path: Path, matmul_model: ModelArtifact) -> None:
    import onnxruntime

    if eps.availability_of(onnxruntime, TENSORRT):
        pytest.skip(f"TensorRT unavailable: {eps.availability_of(onnxruntime, TENSORRT)}")
    target = OnnxRuntimeTarget(
        OnnxRuntimeTarget.Config(id="trt", runtime="onnxruntime", providers=["tensorrt", "cuda", "cpu"], tensorrt={"fp16": True})
    )
    target.cache_dir = tmp_path / "cache"
    session = target.open_session(matmul_model)
    assert session.details["providers"][0] == TENSORRT
    session.run({"x": np.ones((1, 64), dtype=np.float32)})
    engines = list((tmp_path / "cache" / "tensorrt").glob("*/engines/*"))
    assert engines, "TensorRT wrote no engine into the store's cache folder"
    assert CPU in session.details["providers"]


def _plain_cuda_outputs(model: ModelArtifact, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    target = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="plain", runtime="onnxruntime", device="cuda"))
    return target.open_session(model).run(feeds)


def test_cuda_io_binding_keeps_feeds_and_results_on_the_device(matmul_model: ModelArtifact) -> None:
    target = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="gpu", runtime="onnxruntime", device="cuda", io_binding=True))
    session = target.open_session(matmul_model)
    assert session.details["io_binding"] == "device"
    assert session.details["io_binding_device"] == "cuda:0"
    for batch in (2, 2, 7):
        x = np.random.default_rng(batch).standard_normal((batch, 64)).astype(np.float32)
        (y,) = session.run({"x": x})
        np.testing.assert_allclose(y, _plain_cuda_outputs(matmul_model, {"x": x})[0], rtol=1e-5, atol=1e-5)
    x = np.ones((4, 64), dtype=np.float32)
    call = session.prepare({"x": x})
    session.synchronize()
    for _ in range(5):
        call()
    session.synchronize()
    binder = session._binder
    assert binder is not None and binder.last is not None
    (value,) = binder.last.outputs
    assert value.device_name().lower() == "cuda"
    np.testing.assert_allclose(value.numpy(), _plain_cuda_outputs(matmul_model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_a_cuda_graph_is_captured_per_input_shape_and_replays_new_values(matmul_model: ModelArtifact) -> None:
    target = OnnxRuntimeTarget(
        OnnxRuntimeTarget.Config(id="graph", runtime="onnxruntime", providers=["cuda"], cuda={"enable_cuda_graph": True})
    )
    assert target.config.binds_io  # automatic with a CUDA graph
    session = target.open_session(matmul_model)
    assert session.details["io_binding"] == "device"
    assert session.details["cuda_graph"]["enabled_by"] == "cuda.enable_cuda_graph"
    rng = np.random.default_rng(0)
    for batch in (1, 1, 1, 4, 4, 1):
        x = rng.standard_normal((batch, 64)).astype(np.float32)
        (y,) = session.run({"x": x})  # replays read the values copied in place
        np.testing.assert_allclose(y, _plain_cuda_outputs(matmul_model, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert session.details["cuda_graph"]["captured_shapes"] == [{"x": [1, 64]}, {"x": [4, 64]}]
    call = session.prepare({"x": np.ones((1, 64), dtype=np.float32)})
    for _ in range(10):
        call()
    session.synchronize()
    settings = target.inference_settings(session.details)
    assert settings["cuda_graph"]["captured_shapes"] == [{"x": [1, 64]}, {"x": [4, 64]}]
    assert settings["provider_options"][0]["enable_cuda_graph"] == "1"
    assert settings["io_binding"] == {"mode": "device", "device": "cuda:0"}


def test_the_cuda_graph_snippet_runs_as_measured(matmul_model: ModelArtifact) -> None:
    target = OnnxRuntimeTarget(
        OnnxRuntimeTarget.Config(id="graph", runtime="onnxruntime", providers=["cuda"], cuda={"enable_cuda_graph": True, "use_tf32": False})
    )
    session = target.open_session(matmul_model)
    code = target.snippet(target.inference_settings(session.details), str(matmul_model.model_file))
    assert "gpu_graph_id" in code
    namespace: dict[str, object] = {}
    exec(compile(code, "snippet", "exec"), namespace)
    assert namespace["session"].get_providers()[0] == CUDA  # type: ignore[attr-defined]
    for seed in (1, 2, 3):
        x = np.random.default_rng(seed).standard_normal((2, 64)).astype(np.float32)
        (bound,) = namespace["run"]({"x": x})  # type: ignore[operator]
        assert bound.device_name().lower() == "cuda"  # the device value itself, not a host copy
        (y,) = namespace["run"]({"x": x}, returns="numpy")  # type: ignore[operator]
        np.testing.assert_allclose(y, session.run({"x": x})[0], rtol=1e-5, atol=1e-5)
