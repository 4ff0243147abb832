"""Why an Olive pass Kiln has no pass for is not carried over: one reason per family of Olive passes."""

from __future__ import annotations

#: why an Olive pass Kiln has no pass for is not carried over, by family (lower-cased type → reason)
_FAMILIES: dict[str, tuple[str, ...]] = {
    "quantizes the PyTorch model's weights with a method Kiln's torch_quant passes (rtn, gptq, quarot) do not have": (
        "autoawqquantizer",
        "mixedprecisionoverrides",
        "autoclip",
    ),
    "rotates or prunes the PyTorch model's weights: Kiln has no such pass (its quarot does QuaRot)": ("spinquant", "slicegpt", "sparsegpt"),
    "fine-tunes the model (adapters): Kiln does not train": (
        "lora",
        "qlora",
        "loftq",
        "dora",
        "loha",
        "lokr",
        "sdlora",
        "extractadapters",
        "mergeadapterweights",
    ),
    # vendor toolchains: each names the SDK Olive's pass imports, and why Kiln does not run it here
    "quantizes a Hugging Face / PyTorch model with AMD Quark's torch path (quark.torch: the LLM weight schemes, "
    "uint4 AWQ and the like, for the Ryzen AI model generator after it), which Kiln does not wrap: amd-quark 0.13 "
    "installs here, but its output is a quantized checkpoint only that generator (Windows, Ryzen AI) turns into a model; "
    "Kiln's quark_quantize runs Quark's ONNX path, for an ONNX model": ("quarkquantization",),
    "quantizes a Hugging Face / PyTorch model with AMD Quark's torch path and Vitis AI's LLM settings (quark.torch, "
    "for the Ryzen AI model generator after it), which Kiln does not wrap: amd-quark 0.13 installs here, but its output is "
    "a quantized checkpoint only that generator (Windows, Ryzen AI) turns into a model; Kiln's quark_quantize runs "
    "Quark's ONNX path, for an ONNX model": ("quarkquantizationvitisai",),
    "needs the Ryzen AI software's model_generate (AMD's NPU model generator for LLMs, shipped with the Ryzen AI SDK for "
    "Windows on Ryzen AI processors; model-generate 0.0.3 on PyPI is a placeholder whose wheel holds only its version "
    "string)": ("vitisgeneratemodelllm", "ryzengeneratemodelllm"),
    "needs the Ryzen AI software's model_generate (its Stable Diffusion generator, shipped with the Ryzen AI SDK for "
    "Windows on Ryzen AI processors, not on PyPI)": ("vitisgeneratemodelsd",),
    "needs Qualcomm's QNN SDK (its converter, model-library and context-binary tools; Qualcomm's download, not on PyPI)": (
        "qnnconversion",
        "qnnmodellibgenerator",
        "qnncontextbinarygenerator",
    ),
    "needs Qualcomm's QAIRT SDK (the qairt Python API and its GenAI builder; Qualcomm's download: PyPI has no qairt-dev distribution)": (
        "qairtpreparation",
        "qairtgenaibuilder",
        "qairtencapsulation",
        "qairtpipelinepass",
    ),
    "needs Qualcomm's QAIRT tooling (its MHA-to-SHA rewrite for the HTP backend), which Kiln does not wrap": ("qairtmha2sha",),
    "needs NVIDIA's ModelOpt ONNX quantizers (nvidia-modelopt[onnx] 0.47 requires cupy-cuda12x and onnxruntime-gpu on "
    "Linux x86_64: a CUDA stack), which Kiln does not wrap": (
        "nvmodeloptquantization",
        "nvmodeloptgraphsurgery",
    ),
    "needs Qualcomm's AIMET (aimet-onnx), which Kiln does not wrap": ("aimetquantization",),
    "re-lays a model out for a static-shape NPU runtime: Kiln has no such pass": (
        "capturelayerannotations",
        "inputnchwtonhwc",
    ),
    "converts with optimum (the whole Hugging Face pipeline, ONNX): Kiln's torch_export converts the one model": (
        "optimumconversion",
        "optimummerging",
    ),
    "k-quant of the PyTorch model's weights: Kiln's k-quant is ONNX-level (int4_weights algorithm k_quant)": ("kquant",),
    "needs AI Toolkit (VS Code's extension supplies this pass and the Python script it runs; it is not part of "
    "olive-ai): Kiln does not run it": ("aitkpython",),
    "builds with Mobius (ONNX Runtime GenAI's multi-component builder): Kiln's genai_build builds decoders": ("mobiusbuilder",),
}
PASS_REASONS: dict[str, str] = {kind: reason for reason, kinds in _FAMILIES.items() for kind in kinds}


def missing_pass_reason(kind: str) -> str:
    """Why an Olive pass Kiln has no pass for is not carried over."""
    family = PASS_REASONS.get(kind.lower())
    head = f"no Kiln pass for Olive's {kind or 'untyped pass'}"
    return f"{head}: {family}; the chain goes on without it" if family else f"{head}: the chain goes on without it"
