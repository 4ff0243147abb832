"""Olive systems and accelerators → Kiln targets; OrtSessionParamsTuning → their searched session settings.

A system's device and execution provider always survive the translation: each accelerator of the
engine's target system (a device kind and its execution providers) becomes a target that carries
both (the ONNX Runtime target's ``device`` and ``providers``, with the option that puts the EP on
that device kind; the GenAI target's ``device``; OpenVINO's device), or it is reported as not
carried over with the reason. A device is never changed without a word. Whether the target can run
on this host is the target's own question at run time (``engine targets`` answers it per EP).
"""

from __future__ import annotations

from typing import Any

from engine.olive.passes import SESSION_DEFAULTS, SESSION_OPTIONS

SUFFIX = "ExecutionProvider"

#: the device kind Olive infers for an accelerator that names only its execution providers
EP_DEVICE = {
    "CPUExecutionProvider": "cpu",
    "CUDAExecutionProvider": "gpu",
    "TensorrtExecutionProvider": "gpu",
    "NvTensorRTRTXExecutionProvider": "gpu",
    "MIGraphXExecutionProvider": "gpu",
    "ROCMExecutionProvider": "gpu",
    "DmlExecutionProvider": "gpu",
    "WebGpuExecutionProvider": "gpu",
    "QNNExecutionProvider": "npu",
    "VitisAIExecutionProvider": "npu",
    "OpenVINOExecutionProvider": "cpu",
}

#: the ONNX Runtime GenAI device that runs an execution provider (targets.genai.DEVICES)
GENAI_DEVICE = {
    "CPUExecutionProvider": "cpu",
    "CUDAExecutionProvider": "cuda",
    "DmlExecutionProvider": "dml",
    "QNNExecutionProvider": "qnn",
    "WebGpuExecutionProvider": "webgpu",
    "OpenVINOExecutionProvider": "openvino",
    "VitisAIExecutionProvider": "vitisai",
    "NvTensorRTRTXExecutionProvider": "tensorrt_rtx",
}

#: Olive's device kinds as Kiln's ONNX Runtime target names them
_ORT_DEVICE = {"cpu": "cpu", "gpu": "gpu", "npu": "npu"}

#: the QNN EP's backend for a device kind (its ``backend_type`` option)
_QNN_BACKEND = {"npu": "htp", "gpu": "gpu", "cpu": "cpu"}


def canonical_ep(name: str) -> str:
    """An EP name as ONNX Runtime spells it; Olive matches EP names case-insensitively, so do we."""
    for known in EP_DEVICE:
        if known.lower() == name.lower() or known[: -len(SUFFIX)].lower() == name.lower():
            return known
    return name


def translate_targets(systems: dict[str, Any], chosen: Any, runtime: str, ctx: Any) -> list[dict[str, Any]]:
    """The targets of the engine's target system (the first system when the engine names none). With no
    target named, every other system with an accelerator beyond the CPU is a target too (the recipe names
    it for that device); with one named, the other systems' accelerators are listed, each with its reason."""
    name = chosen if isinstance(chosen, str) else next(iter(systems), None)
    system = (chosen if isinstance(chosen, dict) else systems.get(str(name))) if name or chosen else None
    where = f"systems.{name}" if isinstance(name, str) else "engine.target"
    targets = _system_targets(system, where, runtime, ctx)
    for other, config in systems.items():
        if other == name:
            continue
        beyond_cpu = [pair for pair in accelerator_pairs(config) if pair != ("cpu", "CPUExecutionProvider")]
        if chosen is None and beyond_cpu:
            ctx.notes.append(
                f"systems.{other}: the engine names no target system; its accelerators ({_pairs(beyond_cpu)}) are targets "
                f"beside those of systems.{name}"
            )
            for target in _system_targets(config, f"systems.{other}", runtime, ctx):
                if all(t["id"] != target["id"] for t in targets):
                    targets.append(target)
        elif beyond_cpu:
            ctx.skip(
                f"systems.{other}",
                f"{_pairs(beyond_cpu)}: not the engine's target system ({where}); name it in engine.target to optimize for it",
            )
        else:
            ctx.skip(f"systems.{other}", "not the engine's target system: Kiln runs the target system's accelerators")
    return targets


def accelerator_pairs(system: Any) -> list[tuple[str, str]]:
    """The (device, execution provider) pairs of an Olive system; a device left out is the one Olive
    infers from the execution provider, a system without accelerators is Olive's local CPU."""
    accelerators: Any = None
    if isinstance(system, dict):
        accelerators = (system.get("config") or {}).get("accelerators") or system.get("accelerators")
    pairs = []
    for acc in accelerators or [{"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}]:
        if not isinstance(acc, dict):
            continue
        providers = acc.get("execution_providers") or ["CPUExecutionProvider"]
        for ep in providers if isinstance(providers, list) else [providers]:
            ep = canonical_ep(str(ep))
            pairs.append((str(acc.get("device") or EP_DEVICE.get(ep, "cpu")).lower(), ep))
    return pairs


def _pairs(pairs: list[tuple[str, str]]) -> str:
    return ", ".join(f"{device} + {ep}" for device, ep in pairs)


def _system_targets(system: Any, where: str, runtime: str, ctx: Any) -> list[dict[str, Any]]:
    accelerators: list[Any] = [{"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}]
    ctx.at = where
    if isinstance(system, dict):
        kind = str(system.get("type", "LocalSystem"))
        if kind != "LocalSystem":
            ctx.skip(f"{where}.type", f"{kind}: Kiln runs on this machine (an isolated `environment:` per target)")
        accelerators = (system.get("config") or {}).get("accelerators") or system.get("accelerators") or accelerators
    targets: list[dict[str, Any]] = []
    for index, acc in enumerate(accelerators):
        at = ctx.at = f"{where}.accelerators[{index}]"
        if not isinstance(acc, dict):
            raise TypeError(f"an accelerator is an object {{device, execution_providers}}, not {type(acc).__name__}")
        providers = acc.get("execution_providers") or ["CPUExecutionProvider"]
        for ep in providers if isinstance(providers, list) else [providers]:
            ep = canonical_ep(str(ep))
            device = str(acc.get("device") or EP_DEVICE.get(ep, "cpu")).lower()
            target, reason = _target(device, ep, runtime, ctx)
            if target is None:
                ctx.skip(f"{at}: {device} + {ep}", reason)
                continue
            if all(t["id"] != target["id"] for t in targets):
                targets.append(target)
                if ep != "CPUExecutionProvider" or device != "cpu":
                    ctx.notes.append(f"{at}: {device} + {ep} → target '{target['id']}' ({_describe(target)})")
    return targets


def _describe(target: dict[str, Any]) -> str:
    parts = [str(target["runtime"]), f"device {target['device']}"]
    if target.get("providers"):
        parts.append("providers " + ", ".join(target["providers"]))
    return ", ".join(parts)


def _target(device: str, ep: str, runtime: str, ctx: Any) -> tuple[dict[str, Any] | None, str]:
    """The target that runs ``ep`` on ``device`` with ``runtime``, or None and why none can."""
    if device not in _ORT_DEVICE:
        return None, f"Olive's device '{device}' is none of Kiln's device kinds (cpu, gpu, npu)"
    if runtime == "onnxruntime-genai":
        return _genai_target(device, ep)
    if runtime == "openvino":
        if ep not in ("OpenVINOExecutionProvider", "CPUExecutionProvider"):
            return None, f"the passes make an OpenVINO model, which runs on OpenVINO's {device.upper()} device, not on {ep}"
        return {"id": f"openvino-{device}", "runtime": "openvino", "device": device.upper()}, ""
    return _ort_target(device, ep, ctx), ""


def _genai_target(device: str, ep: str) -> tuple[dict[str, Any] | None, str]:
    genai = GENAI_DEVICE.get(ep)
    if genai is None:
        devices = ", ".join(sorted(set(GENAI_DEVICE.values())))
        return None, f"the model builder's output runs on ONNX Runtime GenAI, which has no {ep} device (it has {devices})"
    target: dict[str, Any] = {"id": f"genai-{genai}", "runtime": "onnxruntime-genai", "device": genai}
    if device != EP_DEVICE.get(ep, device):  # the EP on another kind of device than its usual one
        target["id"] += f"-{device}"
        if ep == "QNNExecutionProvider":
            target["provider_options"] = {"backend_type": _QNN_BACKEND[device]}
        elif ep == "OpenVINOExecutionProvider":
            target["provider_options"] = {"device_type": device.upper()}
        else:
            return None, f"ONNX Runtime GenAI's {genai} device runs on a {EP_DEVICE.get(ep)}, not on an {device}"
    return target, ""


def _ort_target(device: str, ep: str, ctx: Any) -> dict[str, Any]:
    alias = _alias(ep)
    kind = "cuda" if ep in ("CUDAExecutionProvider", "TensorrtExecutionProvider") else _ORT_DEVICE[device]
    target: dict[str, Any] = {"id": alias if alias == device else f"{alias}-{device}", "runtime": "onnxruntime", "device": kind}
    if ep != "CPUExecutionProvider":
        target["providers"] = [ep]
    if ep == "QNNExecutionProvider":
        target["provider_options"] = [{"backend_type": _QNN_BACKEND[device]}]
    if ep == "OpenVINOExecutionProvider":
        target["openvino"] = {"device_type": device.upper()}
        ctx.notes.append(
            "OpenVINOExecutionProvider: needs the onnxruntime-openvino wheel; give the target an isolated "
            "environment: {requirements: [onnxruntime-openvino]}, or use the native `openvino` runtime"
        )
    return target


def _alias(ep: str) -> str:
    """Kiln's alias of an EP (targets' ids are made of it): cuda, qnn, tensorrt_rtx, ...; a plugin EP's lowered stem."""
    aliases = {
        "CPUExecutionProvider": "cpu",
        "CUDAExecutionProvider": "cuda",
        "TensorrtExecutionProvider": "tensorrt",
        "NvTensorRTRTXExecutionProvider": "tensorrt_rtx",
        "MIGraphXExecutionProvider": "migraphx",
        "ROCMExecutionProvider": "rocm",
        "DmlExecutionProvider": "dml",
        "WebGpuExecutionProvider": "webgpu",
        "QNNExecutionProvider": "qnn",
        "VitisAIExecutionProvider": "vitisai",
        "OpenVINOExecutionProvider": "openvino",
    }
    stem = ep[: -len(SUFFIX)] if ep.endswith(SUFFIX) else ep
    return aliases.get(ep) or "".join(c for c in stem.lower() if c.isalnum() or c == "_") or "ep"


def session_settings(config: dict[str, Any], where: str, ctx: Any) -> dict[str, Any]:
    search: dict[str, Any] = {}
    fixed: dict[str, Any] = {}
    for key, value in {**config, **(config.get("config") or {})}.items():
        if key in ("type", "config") or SESSION_DEFAULTS.get(key, object()) == value:
            continue
        if key in SESSION_OPTIONS:
            kiln, convert = SESSION_OPTIONS[key]
            values = [convert(v) for v in (value if isinstance(value, list) else [value])]
            if len(values) > 1 and ctx.searching:
                search[kiln] = values
            else:
                fixed[kiln] = values[0]
        elif key == "io_bind":
            search["io_binding"] = [False, True]
        else:
            ctx.skip(f"{where}.{key}", "no Kiln session setting for it")
    if search:
        fixed["search"] = search
    ctx.notes.append(f"{where}: OrtSessionParamsTuning → the ONNX Runtime targets' searched session settings")
    return fixed
