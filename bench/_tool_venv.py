"""A plain virtual environment for another tool a benchmark runs beside Kiln (Olive, Optimum).

Not one of Kiln's isolated environments (engine/execute/environments.py): those install with uv,
which does not read pip's configuration, so a tool's ``torch`` requirement would pull PyPI's
multi-GB CUDA build. Here pip installs with ``-c constraints.txt`` (torch pinned to the CPU
wheel), and a ``.pth`` file puts Kiln's own site-packages after the environment's: what the tool
needs beyond Kiln's stack lives in the environment, and torch, onnx and onnxruntime are the very
libraries Kiln runs with (both tools time the same runtimes). Built once per requirements hash
(requirements, constraints, Python, Kiln's prefix) under ``~/.cache/kiln-bench`` and reused.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
DEFAULT_VENV_ROOT = Path.home() / ".cache" / "kiln-bench"


def requirements_key(requirements: tuple[str, ...]) -> str:
    """A hash of what the environment is built from: requirements, constraints, Python, Kiln's prefix."""
    constraints = CONSTRAINTS.read_text(encoding="utf-8") if CONSTRAINTS.is_file() else ""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    text = "\n".join([*requirements, constraints, version, sys.prefix])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def python_of(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def ensure_venv(tool: str, requirements: tuple[str, ...], venv: Path | None, log: Callable[[str], Any] = print) -> Path:
    """The Python of ``tool``'s environment, built first unless its marker names this requirements hash."""
    key = requirements_key(requirements)
    venv = venv or DEFAULT_VENV_ROOT / f"{tool}-venv-{key}"
    marker = venv / f"kiln-bench-{tool}.json"
    if marker.is_file() and json.loads(marker.read_text(encoding="utf-8")).get("key") == key and python_of(venv).exists():
        return python_of(venv)
    log(f"building {tool}'s environment in {venv} ({', '.join(requirements)}) ...")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = python_of(venv)
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    main_site = sysconfig.get_paths()["purelib"]
    Path(site, "_kiln_main_environment.pth").write_text(f"import site; site.addsitedir({main_site!r})\n", encoding="utf-8")
    command = [str(python), "-m", "pip", "install", "-q", "-c", str(CONSTRAINTS), *requirements]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"installing {requirements[0]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    freeze = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True, check=False).stdout
    marker.write_text(json.dumps({"key": key, "requirements": list(requirements), "freeze": freeze}, indent=2), encoding="utf-8")
    return python
