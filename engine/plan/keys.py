"""Job keys: the sha256 of a canonical document naming everything that changes a job's result.

The key document is stored next to the result, so a later plan can say which field changed.
"""

from __future__ import annotations

import os
import platform
import re
from functools import cache
from typing import Any

import engine
from engine.core.config import library_versions
from engine.core.hashing import SCHEME, sha256_json


def kiln_version() -> str:
    """Kiln's own version (``engine.__version__``): it names the code of Kiln's built-in plugins."""
    return str(engine.__version__)


def _key(doc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    doc = {"scheme": SCHEME, **doc}
    return sha256_json(doc), doc


def pass_key(
    pass_cls: Any,
    config: dict[str, Any],
    input_digest: str,
    data: dict[str, str],
    target: dict[str, Any] | None,
    evaluations: dict[str, Any] | None = None,
    environment: dict[str, Any] | None = None,
    facet: dict[str, Any] | None = None,
    libraries: dict[str, str | None] | None = None,
    builtin: bool = False,
) -> tuple[str, dict[str, Any]]:
    """``target``: the fingerprint a target-dependent pass's key names; ``facet``: the part of
    the target another pass's output depends on with this config (``Pass.target_facet``; None:
    the key names no target, as for every pass before facets existed); ``environment``: the
    step's own isolated environment (absent otherwise, so other keys stay); ``libraries``: the
    versions of the pass's libraries where it runs (None: this environment's); ``builtin``: the
    pass's code ships with Kiln, so Kiln's version is named too (a plugin's own ``version`` and
    libraries name its code, as before)."""
    doc_extra: dict[str, Any] = {"evaluations": evaluations} if evaluations else {}
    if environment is not None:
        doc_extra["environment"] = environment
    if builtin:
        doc_extra["kiln"] = kiln_version()
    return _key(
        {
            **doc_extra,
            "kind": "pass",
            "pass": pass_cls.name,
            "version": pass_cls.version,
            "config": config,
            "input": input_digest,
            "data": data,
            "target": target if pass_cls.target_dependent else facet,
            "libraries": libraries if libraries is not None else library_versions(pass_cls.libraries),
        }
    )


def eval_key(
    evaluator_cls: Any,
    config: dict[str, Any],
    model_digest: str,
    reference_digest: str | None,
    target: dict[str, Any],
    data: dict[str, str],
) -> tuple[str, dict[str, Any]]:
    return _key(
        {
            "kind": "eval",
            "evaluator": evaluator_cls.name,
            "version": evaluator_cls.version,
            "config": config,
            "model": model_digest,
            "reference": reference_digest if evaluator_cls.needs_reference else None,
            "target": target,
            "data": data,
            "host": timing_host(target) if evaluator_cls.timing else None,
            "libraries": library_versions(evaluator_cls.libraries),
        }
    )


def dataset_key(
    source_cls: Any, config: dict[str, Any], file_digests: dict[str, str], input_digest: str | None
) -> tuple[str, dict[str, Any]]:
    """Paths are replaced by their contents' digests: moving a data file keeps its key."""
    portable = {name: (file_digests[name] if name in file_digests else value) for name, value in config.items()}
    return _key(
        {
            "kind": "dataset",
            "source": source_cls.name,
            "version": source_cls.version,
            "config": portable,
            "input": input_digest,
            "libraries": library_versions(source_cls.libraries),
        }
    )


_ISA = re.compile(r"^(avx\w*|amx\w*|sse4_\d|fma|f16c|vnni\w*)$")


@cache
def host_fingerprint() -> dict[str, Any]:
    """What timings depend on: CPU model, core count, the vector ISA flags."""
    model, flags = "", []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = sorted(f for f in line.split(":", 1)[1].split() if _ISA.match(f))
                    break
    except OSError:
        pass
    return {"machine": platform.machine(), "cpu": model or platform.processor(), "cores": os.cpu_count(), "isa": flags}


def timing_host(target: dict[str, Any]) -> dict[str, Any]:
    """The host a timing belongs to: the CPU always, and for a target on another device (a GPU,
    an NPU) that device's model, driver and runtime libraries too, so a timing taken on one GPU
    is never served for another."""
    host = host_fingerprint()
    device = str((target.get("options") or {}).get("device", "cpu")).lower()
    if device != "cpu":
        host = {**host, "accelerators": accelerator_fingerprint()}
    return host


#: distributions whose versions change what a GPU timing measures (CUDA runtime, cuDNN, TensorRT, ...)
_GPU_LIBRARIES = re.compile(
    r"^(nvidia-(cuda-runtime|cudnn|cublas|cufft|curand|nccl)(-cu\d+)?|tensorrt(-[a-z0-9]+)*|onnxruntime-gpu|torch)$", re.I
)


@cache
def accelerator_fingerprint() -> dict[str, Any]:
    """NVIDIA GPUs (model, driver, memory, compute capability; from nvidia-smi) and the versions
    of the CUDA / cuDNN / TensorRT libraries installed for Python. Empty where there are none."""
    import shutil
    import subprocess
    from importlib import metadata

    gpus: list[dict[str, str]] = []
    cuda_driver = None
    smi = shutil.which("nvidia-smi")
    if smi:
        fields = ("name", "driver_version", "memory.total", "compute_cap")
        try:
            out = subprocess.run(
                [smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader"], capture_output=True, text=True, timeout=10, check=False
            )
            gpus = [
                dict(zip(fields, (v.strip() for v in line.split(",")), strict=False)) for line in out.stdout.splitlines() if line.strip()
            ]
            header = subprocess.run([smi], capture_output=True, text=True, timeout=10, check=False).stdout
            found = re.search(r"CUDA Version:\s*([\d.]+)", header)
            cuda_driver = found.group(1) if found else None
        except (OSError, subprocess.SubprocessError):
            gpus = []
    libraries = sorted(
        {
            f"{dist.metadata['Name']}=={dist.version}"
            for dist in metadata.distributions()
            if _GPU_LIBRARIES.match(dist.metadata["Name"] or "")
        }
    )
    return {"nvidia": gpus, "cuda_driver": cuda_driver, "libraries": libraries}


def explain(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """The fields that differ between two key documents, as dotted paths."""
    changed = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if isinstance(a, dict) and isinstance(b, dict):
            changed.extend(explain(a, b, f"{prefix}{name}."))
        elif a != b:
            changed.append(f"{prefix}{name}")
    return changed
