"""Catch what a library logs, instead of letting it reach the console: one collector serves the
ONNX passes (``quiet_library``), onnxruntime's quantizer (``capture_library_logs``) and OpenVINO /
NNCF (``passes.openvino._quiet.library_output``).

``onnxruntime.quantization`` logs through the *root* logger (``logging.warning(...)``) and
through ``onnxruntime.quantization.*`` loggers. With no handler configured, Python prints those
records to stderr, which a pass must not do; and some of them are the only sign of a partial
failure (``quant_pre_process`` logs "ONNX Runtime Model Optimization Failed!" and carries on).
The collector keeps them while a block runs so the pass can report them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class LibraryMessage:
    source: str  # the logger's name, or "warnings" / "stdout"
    level: str
    message: str


class LogCollector(logging.Handler):
    """Records at ``level`` or above logged by the thread that created the collector (passes may
    run side by side in one process), of the loggers named by ``prefixes`` (None: every logger;
    ``root`` is the root logger)."""

    def __init__(self, level: int = logging.WARNING, prefixes: tuple[str, ...] | None = None) -> None:
        super().__init__(level=level)
        self.prefixes = prefixes
        self.thread = threading.get_ident()
        self.messages: list[LibraryMessage] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread != self.thread:
            return
        if self.prefixes is not None and not any(record.name == p or record.name.startswith(p + ".") for p in self.prefixes):
            return
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed library log call must not fail the pass
            text = str(record.msg)
        self.messages.append(LibraryMessage(record.name, record.levelname, text.strip()))


@contextmanager
def capture_library_logs(prefixes: tuple[str, ...] = ("root", "onnxruntime")) -> Iterator[list[LibraryMessage]]:
    """Collect WARNING+ records of the loggers named by ``prefixes`` (``root`` is the root logger).

    The handler sits on the root logger for the duration of the block, so Python's last-resort
    stderr printing does not fire; handlers the application configured still receive everything.
    """
    collector = LogCollector(logging.WARNING, prefixes)
    root = logging.getLogger()
    root.addHandler(collector)
    try:
        yield collector.messages
    finally:
        root.removeHandler(collector)


def first_line(text: str) -> str:
    """A logged traceback's last line (it says what failed), else the first line, at most 300 characters."""
    lines = text.strip().splitlines()
    if lines and lines[0].startswith("Traceback"):
        lines = lines[-1:]
    return lines[0][:300] if lines else ""


def distinct(messages: list[LibraryMessage], limit: int = 20) -> list[str]:
    """The distinct messages, in first-seen order, at most ``limit`` of them."""
    seen: dict[str, None] = {}
    for m in messages:
        text = m.message
        if text.startswith("Traceback") and text.splitlines():
            text = text.splitlines()[-1]  # a logged traceback: its last line says what failed
        seen.setdefault(f"{m.level}: {text}", None)
    return cap(list(seen), limit)


def cap(texts: list[str], limit: int = 20) -> list[str]:
    return [*texts[:limit], f"... and {len(texts) - limit} more"] if len(texts) > limit else texts
