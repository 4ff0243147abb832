"""Running jobs in worker processes: crash, timeout and Ctrl-C handling live here, nowhere else."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.store import Store, write_json_atomic


@dataclass
class Outcome:
    ok: bool
    record: dict[str, Any] | None = None
    error: str | None = None
    log: Path | None = None


def _tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").rstrip().splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class LocalExecutor:
    """One worker process per job, one job at a time: on a 2-core machine timings measured next
    to other work measure nothing, so the local executor never overlaps jobs."""

    def __init__(self, store: Store, python: str | None = None) -> None:
        self.store = store
        self.python = python or sys.executable
        self.logs = store.root / "logs"

    def run(self, job: dict[str, Any], timeout_s: float | None = None) -> Outcome:
        staging = self.store.staging(job["kind"])
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{job['key']}.log"
        job = {**job, "store": str(self.store.root), "staging": str(staging), "result": str(staging / "result.json")}
        job_file = staging / "job.json"
        write_json_atomic(job_file, job)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        with open(log_path, "w", encoding="utf-8") as log:
            process = subprocess.Popen(
                [self.python, "-m", "engine.worker", str(job_file)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
            try:
                code = process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._kill(process)
                shutil.rmtree(staging, ignore_errors=True)
                return Outcome(
                    ok=False, error=f"timed out after {timeout_s:g} s (raise the step's timeout_s if it needs longer)", log=log_path
                )
            except BaseException:  # Ctrl-C or the engine being stopped: take the worker down too
                self._kill(process)
                shutil.rmtree(staging, ignore_errors=True)
                raise
        try:
            outcome = json.loads((staging / "result.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            why = f"the worker died with {_signal_name(code)}" if code < 0 else f"the worker exited with code {code} and no result"
            tail = _tail(log_path)
            shutil.rmtree(staging, ignore_errors=True)
            return Outcome(ok=False, error=why + (f"; its last output:\n{tail}" if tail else ""), log=log_path)
        shutil.rmtree(staging, ignore_errors=True)
        if outcome.get("ok"):
            return Outcome(ok=True, record=outcome["record"], log=log_path)
        error = outcome.get("error") or "unknown error"
        if outcome.get("traceback"):
            error += f" (traceback in {log_path})"
        return Outcome(ok=False, error=error, log=log_path)

    @staticmethod
    def _kill(process: subprocess.Popen[bytes]) -> None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
