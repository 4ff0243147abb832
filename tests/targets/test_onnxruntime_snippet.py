"""The ``inference.py`` Kiln writes beside a chosen ONNX model, run as a program in its own
process: with I/O binding its ``run()`` hands back the bound outputs where they are (OrtValues, or
torch tensors sharing them through DLPack) and copies them to the host only when asked, and it
never names the CPU execution provider for a session that disables CPU fallback. On a CPU the
bound values live in host memory; the same code path binds CUDA memory on a GPU
(tests/targets/test_onnxruntime_gpu.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.core.artifact import ModelArtifact
from targets.onnxruntime import CPU, OnnxRuntimeTarget
from targets.onnxruntime.placement import DISABLE_CPU_FALLBACK

CHECK_RUN = """
import json, sys
import numpy as np
import onnxruntime as ort
import torch

namespace = {}
exec(open(sys.argv[1]).read(), namespace)
run = namespace["run"]
x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
first = run({"x": x})
again = run({"x": x + 1})
tensors = run({"x": x}, returns="torch")
copies = run({"x": x}, returns="numpy")
copies_later = run({"x": x + 1}, returns="numpy")
print(json.dumps({
    "types": sorted({type(value).__name__ for value in first}),
    "same_buffers": [a is b for a, b in zip(first, again)],
    "torch_shares": [t.data_ptr() == v.data_ptr() for t, v in zip(tensors, first)],
    "copies": [type(c).__name__ for c in copies],
    "copy_kept": bool(np.array_equal(copies[0], namespace["session"].run(None, {"x": x})[0])),
    "copy_apart": bool(not np.array_equal(copies[0], copies_later[0])),
    "y": run({"x": x})[0].numpy().tolist(),  # the bound values hold the latest run's outputs
}))
"""


def _mlp(folder: Path) -> ModelArtifact:
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"]), helper.make_node("Neg", ["y"], ["z"])],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 4]),
        ],
        initializer=[numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")],
    )
    folder.mkdir(parents=True)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(folder / "model.onnx"))
    return ModelArtifact.from_folder("onnx", folder)


def _program(tmp_path: Path, code: str) -> Path:
    program = tmp_path / "inference.py"
    program.write_text(code)
    return program


def test_the_bound_snippet_returns_the_bound_values_and_copies_only_when_asked(tmp_path: Path) -> None:
    model = _mlp(tmp_path / "mlp")
    target = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="t", runtime="onnxruntime", io_binding=True))
    session = target.open_session(model)
    program = _program(tmp_path, target.snippet(target.inference_settings(session.details), str(model.model_file)))
    check = tmp_path / "check.py"
    check.write_text(CHECK_RUN)
    done = subprocess.run([sys.executable, str(check), str(program)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["types"] == ["OrtValue"]  # the bound values themselves, no host copy
    assert result["same_buffers"] == [True, True]  # reused from run to run, as measured
    assert result["torch_shares"] == [True, True]  # torch tensors over the same memory (DLPack)
    assert result["copies"] == ["ndarray", "ndarray"] and result["copy_kept"] and result["copy_apart"]
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(np.array(result["y"]), session.run({"x": x})[0], rtol=1e-6)


def test_the_snippet_names_no_cpu_ep_for_a_session_that_disables_cpu_fallback(tmp_path: Path) -> None:
    """onnxruntime lists the CPU EP among a session's providers even when fallback to it is off,
    and refuses a session created with it named and disabled ("Conflicting session configuration").
    A graph without nodes opens on a non-CPU provider here (Azure's, in every onnxruntime wheel)."""
    import onnxruntime

    if "AzureExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime build has no AzureExecutionProvider to stand for a GPU provider")
    graph = helper.make_graph(
        [],
        "none",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
    )
    (tmp_path / "m").mkdir()
    onnx.save_model(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(tmp_path / "m" / "model.onnx")
    )
    options = onnxruntime.SessionOptions()
    options.add_session_config_entry(DISABLE_CPU_FALLBACK, "1")
    measured = onnxruntime.InferenceSession(str(tmp_path / "m" / "model.onnx"), options, providers=["AzureExecutionProvider"])
    assert CPU in measured.get_providers()  # what a session reports, and what the settings were read from
    target = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="t", runtime="onnxruntime"))
    details = {
        "providers": measured.get_providers(),
        "provider_options_passed": {"AzureExecutionProvider": {}},
        "config_entries": {DISABLE_CPU_FALLBACK: "1"},
    }
    settings = target.inference_settings(details)
    assert settings["providers"] == ["AzureExecutionProvider"] and settings["provider_options"] == [{}]
    program = _program(tmp_path, target.snippet(settings, str(tmp_path / "m" / "model.onnx")) + "print(session.get_providers()[0])\n")
    done = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "AzureExecutionProvider"
    # settings recorded before (the CPU EP listed): the snippet leaves it out all the same
    recorded = {**settings, "providers": measured.get_providers(), "provider_options": [{}, {}]}
    assert "providers = ['AzureExecutionProvider']" in target.snippet(recorded, "model.onnx")
