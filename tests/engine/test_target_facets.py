"""Target facets: a pass that is not target-dependent names in its job key only the part of the
target its output depends on (``Pass.target_facet``), so targets with the same facet share one
job, and a facet that is the CPU default keys exactly as before facets existed."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from engine_helpers import tiny_workflow, write_workflow

from engine.core import Pass
from engine.core.target import Availability
from engine.plan import keys
from engine.plan.planner import Plan, build_plan
from engine.workflow import load_workflow
from passes.graph.ort_fusion import OrtFusion
from passes.graph.ort_graph_optimize import OrtGraphOptimize

CUDA = {"id": "cuda", "runtime": "onnxruntime", "device": "cuda"}
TRT = {"id": "trt", "runtime": "onnxruntime", "device": "cuda", "providers": ["TensorrtExecutionProvider", "CUDAExecutionProvider"]}


@pytest.fixture
def gpus_available(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU targets plan on this CPU-only host as they would on one with a GPU (nothing runs)."""
    from targets.onnxruntime import OnnxRuntimeTarget

    monkeypatch.setattr(OnnxRuntimeTarget, "availability", lambda self: Availability(True))


def _plan(tmp_path, tiny_onnx, targets: list[dict[str, Any]], steps: list[dict[str, Any]]) -> Plan:
    workflow = tiny_workflow(tiny_onnx, targets=targets, steps=steps)
    return build_plan(load_workflow(write_workflow(tmp_path, workflow)))


def _jobs(plan: Plan, step_id: str) -> list[Any]:
    return [job for job in plan.jobs.values() if job.step_id == step_id]


def _key(plan: Plan, job: Any) -> tuple[str, dict[str, Any]]:
    return plan.spec(job.id).key("sha256:in", {}, "sha256:workflow-input")


FUSE = [{"id": "fuse", "pass": "ort_fusion", "config": {"model_type": "bert"}}]


def test_fusion_on_a_cpu_target_keys_exactly_as_before_targets_were_read(tmp_path, tiny_onnx) -> None:
    plan = _plan(tmp_path, tiny_onnx, [{"id": "cpu", "runtime": "onnxruntime", "intra_op_threads": 1}], FUSE)
    (job,) = _jobs(plan, "fuse")
    key, doc = _key(plan, job)
    # the key a CPU fusion had when use_gpu defaulted to false and the pass never saw a target
    before = OrtFusion.Config(model_type="bert", use_gpu=False).to_json()
    assert key == keys.pass_key(OrtFusion, before, "sha256:in", {"workflow input": "sha256:workflow-input"}, None, builtin=True)[0]
    assert doc["target"] is None and doc["config"]["use_gpu"] is False
    assert job.target is None and plan.spec(job.id).target is None  # the pass is given no target


def test_two_cpu_targets_with_different_threads_share_one_fusion_job(tmp_path, tiny_onnx) -> None:
    targets = [
        {"id": "cpu1", "runtime": "onnxruntime", "intra_op_threads": 1},
        {"id": "cpu2", "runtime": "onnxruntime", "intra_op_threads": 2},
    ]
    plan = _plan(tmp_path, tiny_onnx, targets, FUSE)
    assert len(_jobs(plan, "fuse")) == 1
    assert {plan.jobs[c.jobs[0]].id for c in plan.candidates if c.jobs} == {_jobs(plan, "fuse")[0].id}


def test_a_cuda_target_gets_gpu_fusion_with_its_own_key(tmp_path, tiny_onnx, gpus_available) -> None:
    targets = [{"id": "cpu", "runtime": "onnxruntime", "intra_op_threads": 1}, CUDA]
    plan = _plan(tmp_path, tiny_onnx, targets, FUSE)
    jobs = {job.target: job for job in _jobs(plan, "fuse")}
    assert set(jobs) == {None, "cuda"}
    cpu_key, _ = _key(plan, jobs[None])
    gpu_key, gpu_doc = _key(plan, jobs["cuda"])
    assert gpu_key != cpu_key
    assert gpu_doc["target"] == {"gpu": True} and gpu_doc["config"]["use_gpu"] is True
    spec = plan.spec(jobs["cuda"].id)
    assert spec.target is not None and spec.target.config["device"] == "cuda"  # the pass runs with the target
    assert spec.target_fingerprint is None  # the key names the facet, not the whole target


def test_cuda_and_tensorrt_targets_share_the_gpu_fusion_job(tmp_path, tiny_onnx, gpus_available) -> None:
    plan = _plan(tmp_path, tiny_onnx, [CUDA, TRT], FUSE)
    (job,) = _jobs(plan, "fuse")
    assert _key(plan, job)[1]["target"] == {"gpu": True}


def test_an_explicit_use_gpu_wins_over_the_target(tmp_path, tiny_onnx, gpus_available) -> None:
    steps = [{"id": "fuse", "pass": "ort_fusion", "config": {"model_type": "bert", "use_gpu": False}}]
    plan = _plan(tmp_path, tiny_onnx, [{"id": "cpu", "runtime": "onnxruntime"}, CUDA], steps)
    (job,) = _jobs(plan, "fuse")  # CPU fusion for both, one job, keyed without a target
    assert _key(plan, job)[1]["target"] is None and job.target is None


def test_fusion_facet_follows_the_providers() -> None:
    def fingerprint(**options: Any) -> dict[str, Any]:
        return {"runtime": "onnxruntime", "options": options}

    auto = {"use_gpu": None}
    assert OrtFusion.target_facet(auto, fingerprint(device="cpu", providers=["CPUExecutionProvider"])) is None
    assert OrtFusion.target_facet(auto, fingerprint(device="cuda", providers=["CUDAExecutionProvider"])) == {"gpu": True}
    assert OrtFusion.target_facet(auto, fingerprint(device="cpu", providers=["DmlExecutionProvider"])) == {"gpu": True, "provider": "dml"}
    assert OrtFusion.target_facet(auto, {"runtime": "openvino", "options": {"device": "CPU"}}) is None
    assert OrtFusion.target_facet(auto, None) is None
    assert OrtFusion.target_facet({"use_gpu": True}, fingerprint(device="cuda")) is None
    assert OrtFusion.resolve_for_target(auto, fingerprint(device="cuda"))["use_gpu"] is True
    assert OrtFusion.resolve_for_target(auto, None)["use_gpu"] is False


def test_graph_optimize_above_basic_is_keyed_by_the_providers_and_basic_is_shared(tmp_path, tiny_onnx, gpus_available) -> None:
    targets = [{"id": "cpu", "runtime": "onnxruntime"}, CUDA, TRT]
    steps = [
        {"id": "basic", "pass": "ort_graph_optimize", "config": {"level": "basic"}},
        {"id": "extended", "pass": "ort_graph_optimize", "after": "basic", "config": {"level": "extended"}},
    ]
    plan = _plan(tmp_path, tiny_onnx, targets, steps)
    (basic,) = _jobs(plan, "basic")
    assert _key(plan, basic)[1]["target"] is None and basic.target is None
    extended = {job.target: job for job in _jobs(plan, "extended")}
    assert set(extended) == {None, "cuda"}  # the TensorRT target shares CUDA's: TensorRT's own result cannot be saved
    assert _key(plan, extended[None])[1]["target"] is None
    assert _key(plan, extended["cuda"])[1]["target"] == {"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]}


def test_graph_optimize_facet() -> None:
    def fingerprint(*providers: str) -> dict[str, Any]:
        return {"runtime": "onnxruntime", "options": {"device": "cuda", "providers": list(providers)}}

    assert OrtGraphOptimize.target_facet({"level": "basic"}, fingerprint("CUDAExecutionProvider")) is None
    assert OrtGraphOptimize.target_facet({"level": "extended"}, fingerprint("CPUExecutionProvider")) is None
    assert OrtGraphOptimize.target_facet({"level": "extended"}, fingerprint("OpenVINOExecutionProvider", "CPUExecutionProvider")) is None
    assert OrtGraphOptimize.target_facet({"level": "extended"}, fingerprint("CUDAExecutionProvider")) == {
        "providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]
    }


class _Dependent(Pass):
    name, summary, accepts, produces = "dependent", "", ("onnx",), "onnx"
    target_dependent: ClassVar[bool] = True

    def run(self, model: Any, ctx: Any) -> Any:
        raise NotImplementedError


class _Independent(_Dependent):
    target_dependent: ClassVar[bool] = False


def test_default_facet_is_the_whole_fingerprint_for_a_target_dependent_pass_else_none() -> None:
    fingerprint = {"runtime": "onnxruntime", "options": {"device": "cpu"}}
    assert _Dependent.target_facet({}, fingerprint) == fingerprint
    assert _Independent.target_facet({}, fingerprint) is None
    assert _Independent.resolve_for_target({"x": 1}, fingerprint) == {"x": 1}
    # a facet enters the key of a pass that is not target-dependent; a fingerprint does not
    assert keys.pass_key(_Independent, {}, "sha256:in", {}, fingerprint)[1]["target"] is None
    assert keys.pass_key(_Independent, {}, "sha256:in", {}, None, facet={"gpu": True})[1]["target"] == {"gpu": True}
