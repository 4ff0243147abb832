"""ort_graph_optimize on a small graph built here: onnxruntime optimizes, onnxruntime runs the result."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from engine.core import ModelArtifact, PassContext, PassError, PassResult
from passes.common.onnx_io import ort_limits
from passes.graph.ort_graph_optimize import OrtGraphOptimize

X = np.random.default_rng(100).standard_normal((8, 16)).astype(np.float32)


def _scaled_linear(ir_version: int = 10) -> onnx.ModelProto:
    """x -> MatMul(Transpose(W0)) -> Mul(0.5) -> Add(b) -> Identity -> y.

    basic folds the constant Transpose and drops the Identity; extended also fuses MatMul + Mul
    into com.microsoft FusedMatMul."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Transpose", ["W0"], ["W"], name="transpose_w"),
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Mul", ["h", "scale"], ["h_scaled"], name="scale"),
        helper.make_node("Add", ["h_scaled", "b"], ["h_biased"], name="bias"),
        helper.make_node("Identity", ["h_biased"], ["y"], name="identity"),
    ]
    graph = helper.make_graph(
        nodes,
        "scaled_linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
        [
            numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W0"),
            numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b"),
            numpy_helper.from_array(np.array(0.5, np.float32), "scale"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ir_version)


def _artifact(folder: Path, model: onnx.ModelProto) -> ModelArtifact:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    return ModelArtifact.from_folder("onnx", folder)


def _optimize(root: Path, model: onnx.ModelProto, **config: object) -> PassResult:
    source = _artifact(root / "in", model)
    (root / "work").mkdir(parents=True)
    ctx = PassContext(step_id="optimize", workdir=root / "work", output_dir=root / "out")
    return OrtGraphOptimize(OrtGraphOptimize.Config(**config))(source, ctx)


def _run(model_file: Path) -> np.ndarray:
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": X})[0]


def _ops(model_file: Path) -> list[str]:
    return [f"{n.domain}:{n.op_type}" if n.domain else n.op_type for n in onnx.load(str(model_file)).graph.node]


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the engine runs passes with cwd = workdir; tools drop files there


def test_extended_fuses_matmul_and_scale_into_fused_matmul(tmp_path: Path) -> None:
    result = _optimize(tmp_path, _scaled_linear())
    assert _ops(result.model.model_file) == ["com.microsoft:FusedMatMul", "Add"]
    assert result.details["nodes_before"] == 5
    assert result.details["nodes_after"] == 2
    assert result.details["contrib_ops"] == {"com.microsoft:FusedMatMul": 1}
    assert result.details["op_delta"] == {"Identity": -1, "MatMul": -1, "Mul": -1, "Transpose": -1, "com.microsoft:FusedMatMul": 1}
    assert any("contrib ops (1 com.microsoft:FusedMatMul)" in note for note in result.notes)


def test_basic_folds_constants_and_keeps_standard_ops(tmp_path: Path) -> None:
    result = _optimize(tmp_path, _scaled_linear(), level="basic")
    assert _ops(result.model.model_file) == ["MatMul", "Mul", "Add"]
    assert result.details["contrib_ops"] == {}
    assert result.notes == []
    model = onnx.load(str(result.model.model_file))
    assert {entry.domain for entry in model.opset_import} == {""}  # onnxruntime's unused imports are dropped


@pytest.mark.parametrize("level", ["basic", "extended"])
def test_optimized_model_passes_checker_and_matches_the_input(tmp_path: Path, level: str) -> None:
    result = _optimize(tmp_path, _scaled_linear(), level=level)
    onnx.checker.check_model(str(result.model.model_file), full_check=True)  # com.microsoft ops included
    # folding a Transpose and fusing the scale into the MatMul reorders no sums: float32 identical up to rounding
    np.testing.assert_allclose(_run(result.model.model_file), _run(tmp_path / "in" / "model.onnx"), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("level", ["basic", "extended"])
def test_same_input_and_config_give_the_same_bytes(tmp_path: Path, level: str) -> None:
    first = _optimize(tmp_path / "a", _scaled_linear(), level=level)
    second = _optimize(tmp_path / "b", _scaled_linear(), level=level)
    assert first.model.digest == second.model.digest
    assert first.model.model_file.read_bytes() == second.model.model_file.read_bytes()


def test_levels_above_extended_are_not_offered() -> None:
    with pytest.raises(ValidationError, match="'basic' or 'extended'"):
        OrtGraphOptimize.Config(level="all")


def test_disabled_optimizer_is_honoured(tmp_path: Path) -> None:
    result = _optimize(tmp_path, _scaled_linear(), disabled_optimizers=["MatMulScaleFusion"])
    assert "com.microsoft:FusedMatMul" not in _ops(result.model.model_file)
    assert result.details["disabled_optimizers"] == ["MatMulScaleFusion"]


def test_input_with_too_new_ir_version_is_clamped_first(tmp_path: Path) -> None:
    max_ir, _ = ort_limits()
    result = _optimize(tmp_path / "new", _scaled_linear(ir_version=max_ir + 1))
    reference = _optimize(tmp_path / "old", _scaled_linear())
    assert onnx.load(str(result.model.model_file)).ir_version <= max_ir
    assert _ops(result.model.model_file) == _ops(reference.model.model_file)
    np.testing.assert_array_equal(_run(result.model.model_file), _run(reference.model.model_file))


def test_opset_above_the_runtime_is_a_pass_error(tmp_path: Path) -> None:
    _, max_opset = ort_limits()
    model = _scaled_linear()
    model.opset_import[0].version = max_opset + 1
    with pytest.raises(PassError, match=rf"opset {max_opset + 1}.*at most opset {max_opset}"):
        _optimize(tmp_path, model)


def test_workdir_and_cwd_are_left_clean(tmp_path: Path) -> None:
    _optimize(tmp_path / "run", _scaled_linear())
    assert list((tmp_path / "run" / "work").iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert sorted(p.name for p in (tmp_path / "run" / "out").iterdir()) == ["model.onnx"]


def test_attrs_flow_through(tmp_path: Path) -> None:
    source = _artifact(tmp_path / "in", _scaled_linear())
    source = ModelArtifact.from_folder("onnx", source.path, attrs={"tokenizer": "/models/t"})
    (tmp_path / "work").mkdir()
    ctx = PassContext(step_id="optimize", workdir=tmp_path / "work", output_dir=tmp_path / "out")
    assert OrtGraphOptimize()(source, ctx).model.attrs == {"tokenizer": "/models/t"}


# -- the target's providers above basic ------------------------------------------------------------
def _optimize_for(root: Path, model: onnx.ModelProto, target: object, **config: object) -> PassResult:
    source = _artifact(root / "in", model)
    (root / "work").mkdir(parents=True)
    ctx = PassContext(step_id="optimize", workdir=root / "work", output_dir=root / "out", target=target)  # type: ignore[arg-type]
    return OrtGraphOptimize(OrtGraphOptimize.Config(**config))(source, ctx)


def _target(**config: object) -> object:
    from targets.onnxruntime import OnnxRuntimeTarget

    return OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="t", runtime="onnxruntime", **config))


def test_extended_optimizes_with_the_targets_providers_and_basic_with_the_cpus(tmp_path: Path) -> None:
    assert _optimize(tmp_path / "none", _scaled_linear()).details["providers"] == ["CPUExecutionProvider"]
    trt = _target(device="cuda", providers=["TensorrtExecutionProvider", "CUDAExecutionProvider"])
    basic = _optimize_for(tmp_path / "basic", _scaled_linear(), trt, level="basic")
    assert basic.details["providers"] == ["CPUExecutionProvider"]
    cpu = _optimize_for(tmp_path / "cpu", _scaled_linear(), _target(device="cpu"), level="extended")
    assert cpu.details["providers"] == ["CPUExecutionProvider"]


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="needs an onnxruntime build without CUDA")
def test_extended_for_a_gpu_target_on_a_build_without_its_provider_fails_instead_of_optimizing_for_the_cpu(tmp_path: Path) -> None:
    trt = _target(device="cuda", providers=["TensorrtExecutionProvider", "CUDAExecutionProvider"])
    with pytest.raises(PassError, match="optimizes for the target's CUDAExecutionProvider, which onnxruntime"):
        _optimize_for(tmp_path, _scaled_linear(), trt, level="extended")
