"""Olive systems and accelerators → Kiln targets; OrtSessionParamsTuning → their searched session settings."""

from __future__ import annotations

from typing import Any

from engine.olive_passes import SESSION_DEFAULTS, SESSION_OPTIONS


def translate_targets(systems: dict[str, Any], chosen: Any, runtime: str, ctx: Any) -> list[dict[str, Any]]:
    name = chosen if isinstance(chosen, str) else next(iter(systems), None)
    system = (chosen if isinstance(chosen, dict) else systems.get(str(name))) if name or chosen else None
    for other in systems:
        if other != name:
            ctx.skip(f"systems.{other}", "not the engine's target system: Kiln runs the target system's accelerators")
    accelerators = [{"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}]
    ctx.at = f"systems.{name}"
    if isinstance(system, dict):
        kind = str(system.get("type", "LocalSystem"))
        if kind != "LocalSystem":
            ctx.skip(f"systems.{name}.type", f"{kind}: Kiln runs on this machine (an isolated `environment:` per target)")
        accelerators = (system.get("config") or {}).get("accelerators") or system.get("accelerators") or accelerators
    targets: list[dict[str, Any]] = []
    for index, acc in enumerate(accelerators):
        ctx.at = f"systems.{name}.accelerators[{index}]"
        device = str(acc.get("device", "cpu")).lower()
        for ep in acc.get("execution_providers") or ["CPUExecutionProvider"]:
            target = _target(device, ep, runtime, ctx)
            if all(t["id"] != target["id"] for t in targets):
                targets.append(target)
    return targets


def _target(device: str, ep: str, runtime: str, ctx: Any) -> dict[str, Any]:
    alias = str(ep).replace("ExecutionProvider", "").lower()
    if runtime == "onnxruntime-genai":  # ModelBuilder's genai folder runs on ONNX Runtime GenAI
        genai_device = {"cuda": "cuda", "tensorrt": "cuda", "dml": "dml"}.get(alias, "cpu")
        return {"id": f"genai-{genai_device}", "runtime": runtime, "device": genai_device}
    if runtime == "openvino":
        ov_device = {"cpu": "CPU", "gpu": "GPU", "npu": "NPU"}.get(device, "CPU")
        return {"id": f"openvino-{device}", "runtime": "openvino", "device": ov_device}
    target: dict[str, Any] = {"id": alias if alias == device else f"{alias}-{device}", "runtime": "onnxruntime"}
    if alias in ("cuda", "tensorrt"):
        device = "cuda"
    target["device"] = device if device in ("cpu", "cuda", "gpu", "npu") else "cpu"
    if alias != "cpu":
        target["providers"] = [ep]
    if alias == "openvino":
        ctx.notes.append(
            "OpenVINOExecutionProvider: needs the onnxruntime-openvino wheel; give the target an isolated "
            "environment: {requirements: [onnxruntime-openvino]}, or use the native `openvino` runtime"
        )
    return target


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
