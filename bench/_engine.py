"""`engine run` as the benchmarks call it: a subprocess, quiet, timed from outside."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def engine_run(
    workflow: Path, store: Path | str, out: Path | str, *extra: str, ok: tuple[int, ...] = (0, 1)
) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Run the workflow into ``store`` and ``out``; the wall time and the finished process. An exit
    code outside ``ok`` (1: no candidate met the constraints) stops the benchmark."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "engine", "run", str(workflow), "--store", str(store), "-o", str(out), "-q", *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    if done.returncode not in ok:
        raise SystemExit(f"engine run {' '.join(extra)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return wall, done
