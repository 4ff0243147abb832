"""`engine doctor`: what this machine offers Kiln (CPU and its ISA, GPUs, the runtimes and their
backends, isolated environments, the store) and, per target kind, what is missing with the
command that adds it. Each section is gathered on its own: a probe that fails says so in its
section instead of stopping the others."""

from __future__ import annotations

import importlib
import json
import os
import platform
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.table import Table

from engine import registry
from engine.core.errors import KilnError

# ISA extensions that decide which kernels the runtimes pick (x86 and Arm names as /proc/cpuinfo spells them)
ISA_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16", "amx_fp16", "asimd", "asimddp", "sve", "sve2", "i8mm", "bf16",
)  # fmt: skip


@dataclass
class Section:
    title: str
    rows: list[tuple[str, str]] = field(default_factory=list)


def cpu_section(cpuinfo: Path = Path("/proc/cpuinfo")) -> Section:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "Model") and value.strip():
                model = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags.update(value.split())
    except OSError:
        pass
    present = [f for f in ISA_FLAGS if f in flags]
    missing = [f for f in ("avx2", "avx512f", "avx512_vnni", "amx_int8") if f not in flags and platform.machine() in ("x86_64", "AMD64")]
    return Section(
        "CPU",
        [
            ("model", model),
            ("machine", f"{platform.machine()}, {os.cpu_count()} logical cores, {platform.system()} {platform.release()}"),
            ("ISA", ", ".join(present) or "none of the listed extensions found"),
            ("ISA absent", ", ".join(missing) or "—"),
        ],
    )


def gpu_section() -> Section:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return Section("GPUs", [("NVIDIA", "nvidia-smi not found (no NVIDIA driver here)")])
    query = "--query-gpu=index,name,driver_version,memory.total,compute_cap"
    try:
        done = subprocess.run([smi, query, "--format=csv,noheader"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return Section("GPUs", [("NVIDIA", f"nvidia-smi failed: {error}")])
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        return Section("GPUs", [("NVIDIA", f"nvidia-smi found no GPU: {(done.stderr or done.stdout).strip()[:200]}")])
    rows = []
    for line in lines:
        index, name, driver, memory, capability = ([*line.split(", "), "", "", "", ""])[:5]
        rows.append((f"GPU {index}", f"{name}, driver {driver}, {memory}, compute capability {capability}"))
    return Section("GPUs", rows)


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _installed(*distributions: str) -> str:
    found = [f"{d} {v}" for d in distributions if (v := _version(d))]
    return ", ".join(found) or "not installed"


def onnxruntime_section() -> Section:
    wheels = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml", "onnxruntime-qnn")
    rows = [("packages", _installed(*wheels))]
    try:
        ort = importlib.import_module("onnxruntime")
    except ImportError as error:
        return Section("onnxruntime", [*rows, ("import", f"fails: {error}; pip install onnxruntime")])
    build = getattr(ort, "get_build_info", lambda: "")()
    rows += [("version", ort.__version__), ("build", build.removeprefix("ORT Build Info: ") or "—")]
    rows.append(("providers", ", ".join(ort.get_available_providers())))
    rows.append(("device", getattr(ort, "get_device", lambda: "—")()))
    return Section("onnxruntime", rows)


def genai_section() -> Section:
    rows = [("packages", _installed("onnxruntime-genai", "onnxruntime-genai-cuda", "onnxruntime-genai-directml"))]
    try:
        genai = importlib.import_module("onnxruntime_genai")
    except ImportError as error:
        return Section("onnxruntime-genai", [*rows, ("import", f"fails: {error}; pip install onnxruntime-genai")])
    check = getattr(genai, "is_cuda_available", None)
    cuda = ("yes" if check() else "no (pip install onnxruntime-genai-cuda)") if check else "unknown (this version cannot say)"
    return Section("onnxruntime-genai", [*rows, ("version", genai.__version__), ("built with cuda", cuda)])


def _import_openvino() -> Any:
    """``import openvino`` after the modules the openvino target warms a worker with: its first one
    declines openvino_telemetry for this process. A plain import counts a user who never answered
    as consenting and sends an event from a non-daemon ThreadPoolExecutor thread; offline that
    thread never ends, and the command waits for it at exit (``engine.__main__`` joins it)."""
    try:
        modules = registry.load("targets", "openvino").warm_modules("openvino")
    except (KilnError, ValueError, ImportError):  # the target is not installed: openvino alone
        modules = ("openvino",)
    for module in modules:
        importlib.import_module(module)
    return importlib.import_module("openvino")


def openvino_section() -> Section:
    try:
        openvino = _import_openvino()
        devices = list(openvino.Core().available_devices)
    except ImportError as error:
        return Section("OpenVINO", [("import", f"fails: {error}; pip install openvino")])
    except Exception as error:  # noqa: BLE001 - a broken plugin is reported, not raised
        return Section("OpenVINO", [("devices", f"cannot be listed: {error}")])
    return Section("OpenVINO", [("version", openvino.__version__), ("devices", ", ".join(devices) or "none")])


def _size(folder: Path) -> tuple[int, int]:
    total = files = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
                files += 1
            except OSError:
                continue
    return total, files


def _human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def store_section(store_root: Path) -> Section:
    from engine.execute.environments import MARKER, envs_dir

    if not store_root.is_dir():
        return Section("store", [("folder", f"{store_root} (not created yet)")])
    size, files = _size(store_root)
    rows = [("folder", str(store_root)), ("size", f"{_human(size)} in {files} files")]
    envs = envs_dir(store_root)
    built = []
    for folder in sorted(envs.iterdir()) if envs.is_dir() else []:
        try:
            marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        built.append(f"{folder.name[:12]} ({', '.join(marker.get('requirements') or []) or 'no requirements'})")
    rows.append(("isolated environments", f"{len(built)} in {envs}" if built else f"none built ({envs})"))
    rows += [("", line) for line in built]
    return Section("store and environments", rows)


def target_sections() -> list[Section]:
    """Per target kind, what its own checks (``host_report``, else ``availability`` with the
    default config) say: what runs here and what is missing, with the fix in the reason."""
    sections = []
    for name in registry.names("targets"):
        try:
            cls = registry.load("targets", name)
            rows = cls.host_report()
            if not rows:
                target = cls(cls.Config(id="doctor", runtime=name))
                availability = target.availability()
                rows = [(f"device {getattr(target.config, 'device', 'default')}", availability.ok, availability.reason or "runs here")]
        except (KilnError, ValueError) as error:
            sections.append(Section(f"target {name}", [("missing", str(error))]))
            continue
        usable = [backend for backend, ok, _ in rows if ok]
        section = Section(f"target {name}", [("usable here", ", ".join(usable) or "nothing")])
        section.rows += [(f"missing {backend}", why) for backend, ok, why in rows if not ok]
        sections.append(section)
    return sections


def doctor_sections(store_root: Path) -> list[Section]:
    probes: list[Callable[[], Section | list[Section]]] = [
        cpu_section, gpu_section, onnxruntime_section, genai_section, openvino_section, lambda: store_section(store_root), target_sections,
    ]  # fmt: skip
    sections: list[Section] = []
    for probe in probes:
        found = probe()
        sections += found if isinstance(found, list) else [found]
    return sections


def print_doctor(store_root: Path) -> None:
    from engine.report.report import console

    for section in doctor_sections(store_root):
        table = Table(title=section.title, title_justify="left", show_header=False)
        table.add_column("what", style="bold")
        table.add_column("here", overflow="fold")
        for what, value in section.rows:
            table.add_row(what, value)
        console.print(table)
