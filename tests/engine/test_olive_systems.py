"""Olive systems → Kiln targets: every accelerator's device and execution provider survives, as a
target that carries both (and validates), or as a key not carried over with the reason. Shapes
as the published recipes write them (QNN on the NPU and on the Adreno GPU, WebGPU and TensorRT for
RTX under the model builder, OpenVINO's EP on an NPU, a device left out, a host and a target)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import make_tiny_encoder

from engine.olive.cli import to_yaml
from engine.olive.importer import Translation, translate
from engine.workflow import load_workflow


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("olive-systems")
    make_tiny_encoder(root / "model.onnx")
    (root / "decoder").mkdir()
    config = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 1, "hidden_size": 8}
    (root / "decoder" / "config.json").write_text(json.dumps(config))
    header = b'{"__metadata__":{"format":"pt"}}'
    (root / "decoder" / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)  # never loaded here
    return root


def system(*accelerators: dict[str, Any], kind: str = "LocalSystem") -> dict[str, Any]:
    return {"target_system": {"type": kind, "accelerators": list(accelerators)}}


def translated(folder: Path, systems: dict[str, Any], passes: dict[str, Any] | None = None, name: str = "s") -> Translation:
    builds = any(p.get("type") == "ModelBuilder" for p in (passes or {}).values())
    config = {
        "input_model": {"type": "HfModel", "model_path": "decoder"} if builds else {"type": "ONNXModel", "model_path": "model.onnx"},
        "systems": systems,
        "passes": passes or {"q": {"type": "OnnxDynamicQuantization"}},
        "target": "target_system",
    }
    source = folder / f"{name}.json"
    source.write_text(json.dumps(config))
    translation = translate(config, source, folder)
    dest = folder / f"{name}.yaml"
    dest.write_text(to_yaml(translation, source))
    load_workflow(dest)  # every carried target validates
    return translation


def test_qnn_on_the_npu_and_on_the_gpu_are_two_targets_with_their_backends(folder: Path) -> None:
    t = translated(folder, system({"device": "npu", "execution_providers": ["QNNExecutionProvider"]}), name="qnn-npu")
    assert t.workflow["targets"] == [
        {
            "id": "qnn-npu",
            "runtime": "onnxruntime",
            "device": "npu",
            "providers": ["QNNExecutionProvider"],
            "provider_options": [{"backend_type": "htp"}],
        }
    ]
    t = translated(folder, system({"device": "gpu", "execution_providers": ["QNNExecutionProvider"]}), name="qnn-gpu")
    assert t.workflow["targets"][0]["device"] == "gpu"
    assert t.workflow["targets"][0]["provider_options"] == [{"backend_type": "gpu"}]
    assert any("gpu + QNNExecutionProvider → target 'qnn-gpu'" in note for note in t.notes)


def test_a_device_left_out_is_the_one_olive_infers_from_the_ep(folder: Path) -> None:
    t = translated(folder, system({"execution_providers": ["QNNExecutionProvider"]}), name="nodevice")
    assert [(x["id"], x["device"]) for x in t.workflow["targets"]] == [("qnn-npu", "npu")]


def test_openvino_ep_on_an_npu_asks_openvino_for_the_npu(folder: Path) -> None:
    t = translated(folder, system({"device": "npu", "execution_providers": ["OpenVINOExecutionProvider"]}), name="ov-npu")
    target = t.workflow["targets"][0]
    assert target["providers"] == ["OpenVINOExecutionProvider"] and target["openvino"] == {"device_type": "NPU"}


@pytest.mark.parametrize(
    ("device", "ep", "expected"),
    [
        ("gpu", "WebGpuExecutionProvider", ("genai-webgpu", "webgpu", None)),
        ("gpu", "NvTensorRTRTXExecutionProvider", ("genai-tensorrt_rtx", "tensorrt_rtx", None)),
        ("npu", "QNNExecutionProvider", ("genai-qnn", "qnn", None)),
        ("gpu", "QNNExecutionProvider", ("genai-qnn-gpu", "qnn", {"backend_type": "gpu"})),
        ("npu", "OpenVINOExecutionProvider", ("genai-openvino-npu", "openvino", {"device_type": "NPU"})),
        ("npu", "VitisAIExecutionProvider", ("genai-vitisai", "vitisai", None)),
        ("gpu", "CUDAExecutionProvider", ("genai-cuda", "cuda", None)),
    ],
)
def test_the_model_builders_output_runs_on_the_systems_ep(folder: Path, device: str, ep: str, expected: tuple[Any, ...]) -> None:
    builder = {"mb": {"type": "ModelBuilder", "precision": "int4"}}
    t = translated(folder, system({"device": device, "execution_providers": [ep]}), builder, name=f"mb-{device}-{ep}")
    [target] = t.workflow["targets"]
    assert (target["id"], target["device"], target.get("provider_options")) == expected
    assert target["runtime"] == "onnxruntime-genai"


def test_an_ep_the_target_runtime_cannot_run_is_reported_never_swapped(folder: Path) -> None:
    accelerators = [
        {"device": "gpu", "execution_providers": ["MIGraphXExecutionProvider"]},
        {"device": "cpu", "execution_providers": ["CPUExecutionProvider"]},
    ]
    t = translated(folder, system(*accelerators), {"mb": {"type": "ModelBuilder", "precision": "int4"}}, name="migraphx")
    assert [x["id"] for x in t.workflow["targets"]] == ["genai-cpu"]
    [(where, why)] = [(w, r) for w, r in t.unmapped if "accelerators" in w]
    assert where == "systems.target_system.accelerators[0]: gpu + MIGraphXExecutionProvider"
    assert "no MIGraphXExecutionProvider device" in why


def test_every_accelerator_and_ep_of_the_target_system_is_carried_or_reported(folder: Path) -> None:
    accelerators = [
        {"device": "gpu", "execution_providers": ["DmlExecutionProvider", "CUDAExecutionProvider"]},
        {"device": "npu", "execution_providers": ["VitisAIExecutionProvider"]},
        {"device": "cpu", "execution_providers": ["CPUExecutionProvider", "OpenVINOExecutionProvider"]},
    ]
    host = {"host_system": {"type": "LocalSystem", "accelerators": [{"device": "cpu"}]}}
    t = translated(folder, {**host, **system(*accelerators, kind="PythonEnvironment")}, name="many")
    carried = {(x["device"], tuple(x.get("providers", ["CPUExecutionProvider"]))) for x in t.workflow["targets"]}
    assert carried == {
        ("gpu", ("DmlExecutionProvider",)),
        ("cuda", ("CUDAExecutionProvider",)),
        ("npu", ("VitisAIExecutionProvider",)),
        ("cpu", ("CPUExecutionProvider",)),
        ("cpu", ("OpenVINOExecutionProvider",)),
    }
    skipped = dict(t.unmapped)
    assert "systems.host_system" in skipped and "systems.target_system.type" in skipped


def test_an_ep_name_in_another_case_is_the_same_ep(folder: Path) -> None:
    t = translated(folder, system({"device": "gpu", "execution_providers": ["webgpuexecutionprovider"]}), name="case")
    assert t.workflow["targets"][0]["providers"] == ["WebGpuExecutionProvider"]


def test_a_target_system_the_engine_does_not_name_is_a_target_not_dropped(folder: Path) -> None:
    """A recipe with a CPU host system and a VitisAI NPU system and no engine.target (timm's mobilenetv3
    VitisAI recipe) gets the NPU target beside the CPU one, and says so."""
    host = {"host_system": {"type": "LocalSystem", "accelerators": [{"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}]}}
    npu = system({"device": "npu", "execution_providers": ["VitisAIExecutionProvider"]})
    config = {
        "input_model": {"type": "ONNXModel", "model_path": "model.onnx"},
        "systems": {**host, **npu},
        "passes": {"q": {"type": "OnnxDynamicQuantization"}},
    }
    source = folder / "unnamed.json"
    source.write_text(json.dumps(config))
    t = translate(config, source, folder)
    assert [(x["device"], x.get("providers")) for x in t.workflow["targets"]] == [("cpu", None), ("npu", ["VitisAIExecutionProvider"])]
    assert any("names no target system" in note for note in t.notes)


def test_a_system_the_engine_does_not_target_is_listed_naming_its_ep(folder: Path) -> None:
    gpu = {"docker": {"type": "Docker", "accelerators": [{"device": "gpu", "execution_providers": ["CUDAExecutionProvider"]}]}}
    t = translated(folder, {**system({"device": "cpu"}), **gpu}, name="other")
    assert [x["device"] for x in t.workflow["targets"]] == ["cpu"]
    why = dict(t.unmapped)["systems.docker"]
    assert "gpu + CUDAExecutionProvider" in why and "engine.target" in why
