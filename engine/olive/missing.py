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
    "a vendor toolchain's pass (AMD Quark / Vitis AI / Ryzen AI, Qualcomm QNN / QAIRT, NVIDIA ModelOpt, AIMET): "
    "Kiln does not drive these toolchains": (
        "quarkquantization",
        "quarkquantizationvitisai",
        "vitisgeneratemodelllm",
        "vitisgeneratemodelsd",
        "vitisaiaddmetadata",
        "ryzengeneratemodelllm",
        "qnnpreprocess",
        "qnnconversion",
        "qnnmodellibgenerator",
        "qnncontextbinarygenerator",
        "qairtpreparation",
        "qairtgenaibuilder",
        "qairtencapsulation",
        "qairtmha2sha",
        "qairtpipelinepass",
        "nvmodeloptquantization",
        "nvmodeloptgraphsurgery",
        "aimetquantization",
    ),
    "re-lays a model out for a static-shape NPU runtime: Kiln has no such pass": (
        "capturelayerannotations",
        "inputnchwtonhwc",
    ),
    "converts with optimum (the whole Hugging Face pipeline, ONNX): Kiln's torch_export converts the one model": (
        "optimumconversion",
        "optimummerging",
    ),
    "k-quant of the PyTorch model's weights: Kiln's k-quant is ONNX-level (int4_weights algorithm k_quant)": ("kquant",),
    "AI Toolkit's script pass (runs its own Python): Kiln has no such pass": ("aitkpython",),
    "builds with Mobius (ONNX Runtime GenAI's multi-component builder): Kiln's genai_build builds decoders": ("mobiusbuilder",),
}
PASS_REASONS: dict[str, str] = {kind: reason for reason, kinds in _FAMILIES.items() for kind in kinds}


def missing_pass_reason(kind: str) -> str:
    """Why an Olive pass Kiln has no pass for is not carried over."""
    family = PASS_REASONS.get(kind.lower())
    head = f"no Kiln pass for Olive's {kind or 'untyped pass'}"
    return f"{head}: {family}; the chain goes on without it" if family else f"{head}: the chain goes on without it"
