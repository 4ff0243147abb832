"""A CUDA graph for a model with nodes off the GPU is inapplicable, not a failure: onnxruntime
refuses graph capture when any node sits on the CPU (with the Memcpy nodes that brings), so the
placement record says before measuring that the setting cannot apply. The pruning logic is
checked here on synthetic placement records; the GPU test (test_onnxruntime_gpu.py) opens one."""

from __future__ import annotations

import pytest
from genai_models import TinyGenai

from engine.core.errors import SettingInapplicable, inapplicable_reason
from targets.onnxruntime import CPU, CUDA, OnnxRuntimeTarget, placement


def test_nodes_on_the_cpu_make_a_cuda_graph_inapplicable_and_say_how_many() -> None:
    problem = placement.graph_capture_problem({CUDA: 40, CPU: 3}, CUDA)
    assert problem is not None and "3 nodes on CPUExecutionProvider beside 40 on CUDAExecutionProvider" in problem
    assert "1 node on" in (placement.graph_capture_problem({CUDA: 9, CPU: 1}, CUDA) or "")


@pytest.mark.parametrize("record", [{CUDA: 12}, {CUDA: 12, CPU: 0}, None, {}])
def test_a_model_wholly_on_the_gpu_or_of_unknown_placement_keeps_its_cuda_graph(record: dict[str, int] | None) -> None:
    assert placement.graph_capture_problem(record, CUDA) is None


def test_the_graph_options_are_left_out_to_read_the_placement() -> None:
    options = [{"device_id": "0", "enable_cuda_graph": "1"}, {"trt_cuda_graph_enable": "True", "trt_fp16_enable": "True"}]
    assert placement.without_graph(options) == [{"device_id": "0"}, {"trt_fp16_enable": "True"}]
    assert placement.without_graph(None) is None
    refusal = RuntimeError(
        "This session cannot use the graph capture feature as requested by the user as all compute graph nodes have not "
        "been partitioned to the CUDAExecutionProvider"
    )
    assert placement.refused_graph_capture(refusal)
    assert not placement.refused_graph_capture(RuntimeError("Graph output (present.0.key) does not exist in the graph"))


def test_the_reason_crosses_a_worker_as_text() -> None:
    error = SettingInapplicable("target 'gpu': cuda.enable_cuda_graph cannot apply to this model (3 nodes on CPUExecutionProvider)")
    carried = f"evaluation latency failed: could not open the model: {error}"
    assert (
        inapplicable_reason(carried) == "target 'gpu': cuda.enable_cuda_graph cannot apply to this model (3 nodes on CPUExecutionProvider)"
    )
    assert inapplicable_reason("evaluation latency failed: out of memory") is None


def test_only_a_shared_cache_decoder_takes_a_cuda_graph_of_its_decode_step(tiny_genai: TinyGenai) -> None:
    """The shared past/present buffer keeps every shape of the decode step; a present that grows
    every token makes the setting inapplicable (said when the session opens, before measuring)."""
    from targets.onnxruntime.decoder_layout import DecoderLayout
    from targets.onnxruntime.decoder_loop import graph_problem

    session = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="c", runtime="onnxruntime")).open_session(tiny_genai.fp32)
    assert graph_problem(DecoderLayout.read(tiny_genai.fp32.path, session.inputs), static=False) is None
    unshared = DecoderLayout.read(tiny_genai.unshared.path, session.inputs)
    assert "grow by one position every token" in (graph_problem(unshared, static=False) or "")
    assert "static_llm" in (graph_problem(unshared, static=True) or "")
