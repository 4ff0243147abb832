"""Session settings of the ONNX Runtime target: memory and thread options, typed provider option
groups, I/O binding (CPU path for real here), inference_settings and the runnable snippet."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import onnx
import pydantic
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.core.artifact import ModelArtifact
from engine.core.errors import KilnError
from targets.onnxruntime import CPU, CUDA, TENSORRT, OnnxRuntimeTarget, binding
from targets.onnxruntime.eps import OPENVINO
from targets.onnxruntime.provider_groups import OpenVinoEpOptions, openvino_provider_options
from targets.onnxruntime.target import ALLOW_SPINNING


def make_config(**options: object) -> OnnxRuntimeTarget.Config:
    return OnnxRuntimeTarget.Config(id="t", runtime="onnxruntime", **options)


def make_target(**options: object) -> OnnxRuntimeTarget:
    return OnnxRuntimeTarget(make_config(**options))


@pytest.fixture
def mlp(tmp_path: Path) -> ModelArtifact:
    """y = relu(x @ w + b), z = y * 2, over x [batch, 8] float32: two outputs."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Add", ["h", "b"], ["hb"]),
            helper.make_node("Relu", ["hb"], ["y"]),
            helper.make_node("Mul", ["y", "two"], ["z"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 4]),
        ],
        initializer=[
            numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
            numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    folder = tmp_path / "mlp"
    folder.mkdir()
    onnx.save_model(model, str(folder / "model.onnx"))
    return ModelArtifact.from_folder("onnx", folder)


def feeds(batch: int, seed: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((batch, 8)).astype(np.float32)}


# -- config -------------------------------------------------------------------------------------


def test_new_fields_at_their_defaults_leave_the_fingerprint_as_before() -> None:
    data = make_config().to_json()
    for name in ("cpu_mem_arena", "mem_pattern", "allow_spinning", "config_entries", "io_binding", "cuda", "openvino"):
        assert name not in data
    trt = make_config(providers=["tensorrt", "cuda", "cpu"], tensorrt={"fp16": True}).to_json()
    assert "cuda_graph" not in trt["tensorrt"]


def test_set_fields_enter_the_fingerprint_groups_only_with_what_they_set() -> None:
    data = make_config(providers=["cuda", "cpu"], cpu_mem_arena=False, cuda={"use_tf32": False}).to_json()
    assert data["cpu_mem_arena"] is False
    assert data["cuda"] == {"use_tf32": False}
    assert make_config(providers=["cuda", "cpu"], cuda={"enable_cuda_graph": True}).to_json()["cuda"] == {"enable_cuda_graph": True}
    a = OnnxRuntimeTarget(make_config(intra_op_threads=2)).fingerprint()
    b = OnnxRuntimeTarget(make_config(intra_op_threads=2, allow_spinning=False)).fingerprint()
    assert a != b


def test_dotted_search_overlays_validate() -> None:
    base = {"id": "t", "runtime": "onnxruntime", "providers": ["cuda", "openvino", "cpu"]}
    config = OnnxRuntimeTarget.Config(
        **{**base, "cuda": {"enable_cuda_graph": True}, "openvino": {"num_streams": 2}, "intra_op_threads": 4}
    )
    assert config.cuda is not None and config.cuda.enable_cuda_graph
    assert config.openvino is not None and config.openvino.num_streams == 2
    assert config.binds_io  # automatic: a CUDA graph needs I/O binding


def test_bad_values_name_the_allowed_ones() -> None:
    with pytest.raises(pydantic.ValidationError, match="EXHAUSTIVE"):
        make_config(providers=["cuda"], cuda={"cudnn_conv_algo_search": "FASTEST"})
    with pytest.raises(pydantic.ValidationError, match="THROUGHPUT"):
        make_config(providers=["openvino"], openvino={"performance_hint": "FAST"})
    with pytest.raises(pydantic.ValidationError, match="kNextPowerOfTwo"):
        make_config(providers=["cuda"], cuda={"arena_extend_strategy": "grow"})
    with pytest.raises(pydantic.ValidationError, match="Extra inputs"):
        make_config(providers=["cuda"], cuda={"enable_graph": True})


def test_groups_need_their_provider() -> None:
    with pytest.raises(pydantic.ValidationError, match=f"need {CUDA}"):
        make_config(cuda={"use_tf32": True})
    with pytest.raises(pydantic.ValidationError, match=f"need {OPENVINO}"):
        make_config(openvino={"num_streams": 2})


def test_a_cuda_graph_with_io_binding_off_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="CUDA graphs need I/O binding"):
        make_config(providers=["cuda"], cuda={"enable_cuda_graph": True}, io_binding=False)
    with pytest.raises(pydantic.ValidationError, match="CUDA graphs need I/O binding"):
        make_config(providers=["tensorrt", "cuda"], tensorrt={"cuda_graph": True}, io_binding=False)
    assert not make_config(io_binding=None).binds_io
    assert make_config(providers=["tensorrt", "cuda"], tensorrt={"cuda_graph": True}).cuda_graph == "tensorrt.cuda_graph"


def test_typed_groups_merge_over_raw_provider_options(mlp: ModelArtifact) -> None:
    target = make_target(
        providers=["cuda", "openvino", "tensorrt", "cpu"],
        provider_options=[
            {"device_id": 1, "use_tf32": "1", "gpu_external_alloc": "0"},
            {"load_config": '{"CPU": {"NUM_STREAMS": "2"}}'},
            {},
            {},
        ],
        cuda={"use_tf32": False, "cudnn_conv_algo_search": "HEURISTIC", "enable_cuda_graph": True},
        openvino={"performance_hint": "THROUGHPUT", "precision": "FP32", "enable_qdq_optimizer": True},
        tensorrt={"fp16": True, "cuda_graph": True, "builder_optimization_level": 5},
    )
    options = target.provider_options_for(mlp, "1.0")
    assert options is not None
    cuda, openvino, trt, cpu = options
    assert cuda == {
        "device_id": 1,
        "use_tf32": "0",
        "gpu_external_alloc": "0",
        "cudnn_conv_algo_search": "HEURISTIC",
        "enable_cuda_graph": "1",
    }
    assert openvino["precision"] == "FP32" and openvino["enable_qdq_optimizer"] == "True"
    assert json.loads(openvino["load_config"]) == {"CPU": {"NUM_STREAMS": "2", "PERFORMANCE_HINT": "THROUGHPUT"}}
    assert trt["trt_cuda_graph_enable"] == "True" and trt["trt_builder_optimization_level"] == "5"
    assert cpu == {}


def test_openvino_performance_hint_goes_under_the_device_named() -> None:
    mapped = openvino_provider_options(OpenVinoEpOptions(device_type="GPU.0", performance_hint="LATENCY", num_streams=1), None)
    assert json.loads(mapped["load_config"]) == {"GPU": {"PERFORMANCE_HINT": "LATENCY"}}
    assert mapped["device_type"] == "GPU.0" and mapped["num_streams"] == "1"


def test_session_options_carry_memory_spinning_and_entries() -> None:
    options = make_target(
        cpu_mem_arena=False, mem_pattern=False, allow_spinning=False, config_entries={"session.set_denormal_as_zero": "1"}
    ).session_options()
    assert options.enable_cpu_mem_arena is False
    assert options.enable_mem_pattern is False
    assert options.get_session_config_entry(ALLOW_SPINNING) == "0"
    assert options.get_session_config_entry("session.set_denormal_as_zero") == "1"
    defaults = make_target().session_options()
    assert defaults.enable_cpu_mem_arena is True and defaults.enable_mem_pattern is True


# -- sessions -----------------------------------------------------------------------------------


def test_details_record_non_default_settings_and_binding_off(mlp: ModelArtifact) -> None:
    plain = make_target().open_session(mlp)
    assert plain.details["io_binding"] == "off"
    assert "cpu_mem_arena" not in plain.details and "config_entries" not in plain.details
    tuned = make_target(cpu_mem_arena=False, allow_spinning=True).open_session(mlp)
    assert tuned.details["cpu_mem_arena"] is False
    assert tuned.details["config_entries"] == {ALLOW_SPINNING: "1"}


def test_cpu_io_binding_equals_a_plain_run_repeats_and_rebinds_on_a_new_shape(mlp: ModelArtifact) -> None:
    plain = make_target().open_session(mlp)
    bound = make_target(io_binding=True).open_session(mlp)
    assert bound.details["io_binding"] == "host"
    assert bound.details["io_binding_device"] == "cpu"
    for batch, seed in ((2, 1), (2, 2), (5, 3), (2, 4)):
        expected = plain.run(feeds(batch, seed))
        got = bound.run(feeds(batch, seed))
        assert [a.shape for a in got] == [(batch, 4), (batch, 4)]
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a, b)
    assert "cuda_graph" not in bound.details


def test_bound_results_are_copies_and_feeds_are_never_written(mlp: ModelArtifact) -> None:
    session = make_target(io_binding=True).open_session(mlp)
    first_feeds = feeds(3, 1)
    kept = first_feeds["x"].copy()
    first = session.run(first_feeds)
    before = [a.copy() for a in first]
    session.run(feeds(3, 2))  # same shape: the bound input is updated in place
    np.testing.assert_array_equal(first_feeds["x"], kept)
    for a, b in zip(first, before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_prepared_run_repeats_without_host_copies_and_leaves_results_bound(mlp: ModelArtifact) -> None:
    session = make_target(io_binding=True).open_session(mlp)
    plain = make_target().open_session(mlp)
    data = feeds(4, 7)
    call = session.prepare(data)
    session.synchronize()
    for _ in range(3):
        assert call() is None
    session.synchronize()
    binder = session._binder
    assert binder is not None and binder.last is not None
    for value, expected in zip(binder.last.outputs, plain.run(data), strict=True):
        np.testing.assert_array_equal(value.numpy(), expected)


def test_prepare_without_binding_is_the_sdk_default(mlp: ModelArtifact) -> None:
    session = make_target().open_session(mlp)
    call = session.prepare(feeds(2))
    call()
    assert session.details["io_binding"] == "off"


def test_concurrent_bound_runs_each_keep_their_own_binding(mlp: ModelArtifact) -> None:
    session = make_target(io_binding=True).open_session(mlp)
    plain = make_target().open_session(mlp)
    errors: list[BaseException] = []

    def serve(seed: int) -> None:
        run = session.concurrent()
        try:
            for step in range(20):
                data = feeds(2, seed * 100 + step)
                for a, b in zip(run(data), plain.run(data), strict=True):
                    np.testing.assert_array_equal(a, b)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=serve, args=(seed,)) for seed in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def test_a_closed_bound_session_refuses_to_run(mlp: ModelArtifact) -> None:
    session = make_target(io_binding=True).open_session(mlp)
    session.close()
    with pytest.raises(KilnError, match="closed"):
        session.run(feeds(1))
    with pytest.raises(KilnError, match="closed"):
        session.prepare(feeds(1))


def test_cuda_graph_plans_cap_the_shapes_and_name_them() -> None:
    plan = binding.Plan("cuda", 0, True, ["y"], ["float32"])
    for batch in range(1, binding.MAX_CUDA_GRAPHS + 1):
        assert plan.next_graph_id(binding.signature_of({"x": np.zeros((batch, 8), np.float32)})) == batch
    with pytest.raises(KilnError, match=r"x\[9, 8\] float32 would be one more: CUDA graphs need static shapes"):
        plan.next_graph_id(binding.signature_of({"x": np.zeros((9, 8), np.float32)}))


# -- inference settings and snippet --------------------------------------------------------------


def test_inference_settings_describe_the_session_as_measured(mlp: ModelArtifact) -> None:
    import onnxruntime

    target = make_target(
        intra_op_threads=1, execution_mode="parallel", inter_op_threads=2, mem_pattern=False, allow_spinning=False, io_binding=True
    )
    session = target.open_session(mlp)
    settings = target.inference_settings(session.details)
    json.dumps(settings)  # a JSON document
    assert settings["runtime"] == "onnxruntime"
    assert settings["onnxruntime_version"] == onnxruntime.__version__
    assert settings["providers"] == [CPU]
    assert settings["provider_options"] == [{}]
    assert settings["session_options"] == {
        "intra_op_num_threads": 1,
        "inter_op_num_threads": 2,
        "execution_mode": "ORT_PARALLEL",
        "graph_optimization_level": "ORT_ENABLE_ALL",
        "enable_cpu_mem_arena": True,
        "enable_mem_pattern": False,
        "config_entries": {ALLOW_SPINNING: "0"},
    }
    assert settings["io_binding"] == {"mode": "host", "device": "cpu"}
    assert settings["cuda_graph"] is None
    assert "store_paths" not in settings


def test_tensorrt_cache_folders_are_named_as_store_paths() -> None:
    target = make_target(providers=["tensorrt", "cuda", "cpu"], tensorrt={"fp16": True})
    details = {
        "providers": [TENSORRT, CUDA, CPU],
        "provider_options_passed": {TENSORRT: {"trt_fp16_enable": "True", "trt_engine_cache_path": "/store/x/engines"}, CUDA: {}, CPU: {}},
    }
    settings = target.inference_settings(details)
    assert settings["store_paths"] == [f"{TENSORRT}.trt_engine_cache_path"]
    assert "Kiln's store" in target.snippet(settings, "model.onnx")


@pytest.mark.parametrize("io_binding", [False, True])
def test_the_snippet_runs_and_opens_the_session_as_measured(mlp: ModelArtifact, io_binding: bool) -> None:
    target = make_target(
        intra_op_threads=1, graph_optimization_level="basic", cpu_mem_arena=False, allow_spinning=False, io_binding=io_binding
    )
    session = target.open_session(mlp)
    code = target.snippet(target.inference_settings(session.details), str(mlp.model_file))
    namespace: dict[str, object] = {}
    exec(compile(code, "snippet", "exec"), namespace)
    opened = namespace["session"]
    assert opened.get_providers() == session.details["providers"]  # type: ignore[attr-defined]
    options = opened.get_session_options()  # type: ignore[attr-defined]
    assert options.intra_op_num_threads == 1
    assert options.enable_cpu_mem_arena is False
    assert options.get_session_config_entry(ALLOW_SPINNING) == "0"
    assert str(options.graph_optimization_level).endswith("ORT_ENABLE_BASIC")
    if io_binding:
        assert "io_binding" in code
        run = namespace["run"]
        for seed in (1, 2):
            data = feeds(3, seed)
            for a, b in zip(run(data, returns="numpy"), session.run(data), strict=True):  # type: ignore[operator]
                np.testing.assert_array_equal(a, b)


# -- the OpenVINO EP option group, on the real EP in its isolated environment ---------------------

OV_EP_CHECK = """
import json, sys
sys.path.insert(0, {root!r})
import numpy as np, onnx
from onnx import TensorProto, helper, numpy_helper
from engine.core.artifact import ModelArtifact
from targets.onnxruntime import OnnxRuntimeTarget
from pathlib import Path

folder = Path({folder!r})
folder.mkdir(parents=True, exist_ok=True)
w = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], initializer=[numpy_helper.from_array(w, "w")])
onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(folder / "model.onnx"))
model = ModelArtifact.from_folder("onnx", folder)
config = OnnxRuntimeTarget.Config(id="ov", runtime="onnxruntime", providers=["openvino", "cpu"], io_binding=True,
    openvino={{"device_type": "CPU", "precision": "FP32", "num_streams": 2, "performance_hint": "THROUGHPUT"}})
target = OnnxRuntimeTarget(config)
session = target.open_session(model)
x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
(y,) = session.run({{"x": x}})
settings = target.inference_settings(session.details)
namespace = {{}}
exec(target.snippet(settings, str(model.model_file)), namespace)
(z,) = namespace["run"]({{"x": x}}, returns="numpy")
print("RESULT " + json.dumps({{"providers": session.details["providers"], "io_binding": session.details["io_binding"],
    "max_diff": float(np.abs(y - x @ w).max()), "snippet_diff": float(np.abs(z - y).max()),
    "snippet_providers": namespace["session"].get_providers(), "options": settings["provider_options"][0]}}))
"""


def test_the_openvino_option_group_is_accepted_by_the_real_ep(ov_ep_env: Path, tmp_path: Path) -> None:
    """A wrong option name or value makes onnxruntime drop the OpenVINO EP (and Kiln then refuses
    the session), so a session that keeps it shows the names and load_config are right."""
    import os
    import subprocess

    script = tmp_path / "check.py"
    script.write_text(OV_EP_CHECK.format(root=str(Path(__file__).parents[2]), folder=str(tmp_path / "model")))
    env = {**os.environ, "PYTHONPATH": ""}
    done = subprocess.run([str(ov_ep_env), str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT ") :])
    assert result["providers"][0] == OPENVINO
    assert result["snippet_providers"][0] == OPENVINO
    assert result["io_binding"] == "host"
    assert result["max_diff"] < 1e-4 and result["snippet_diff"] < 1e-5
    assert json.loads(result["options"]["load_config"]) == {"CPU": {"PERFORMANCE_HINT": "THROUGHPUT"}}
    assert result["options"]["num_streams"] == "2"
