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
