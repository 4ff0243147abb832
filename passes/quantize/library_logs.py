"""Catch what onnxruntime's Python quantization tools log, instead of letting it reach the console.

``onnxruntime.quantization`` logs through the *root* logger (``logging.warning(...)``) and
through ``onnxruntime.quantization.*`` loggers. With no handler configured, Python prints those
records to stderr, which a pass must not do; and some of them are the only sign of a partial
failure (``quant_pre_process`` logs "ONNX Runtime Model Optimization Failed!" and carries on).
``capture_library_logs`` collects them while a block runs so the pass can report them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class LibraryMessage:
    logger: str
    level: str
    message: str


class _Collector(logging.Handler):
    def __init__(self, prefixes: tuple[str, ...], thread: int) -> None:
        super().__init__(level=logging.WARNING)
        self.prefixes = prefixes
        self.thread = thread
        self.messages: list[LibraryMessage] = []

    def emit(self, record: logging.LogRecord) -> None:
        # Only the library's records, and only those logged by the thread that runs the pass
        # (passes may run side by side in one process).
        if record.thread != self.thread:
            return
        if not any(record.name == p or record.name.startswith(p + ".") for p in self.prefixes):
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
    collector = _Collector(prefixes, threading.get_ident())
    root = logging.getLogger()
    root.addHandler(collector)
    try:
        yield collector.messages
    finally:
        root.removeHandler(collector)


def distinct(messages: list[LibraryMessage], limit: int = 20) -> list[str]:
    """The distinct messages, in first-seen order, at most ``limit`` of them."""
    seen: dict[str, None] = {}
    for m in messages:
        text = m.message
        if text.startswith("Traceback") and text.splitlines():
            text = text.splitlines()[-1]  # a logged traceback: its last line says what failed
        seen.setdefault(f"{m.level}: {text}", None)
    texts = list(seen)
    if len(texts) > limit:
        texts = [*texts[:limit], f"... and {len(texts) - limit} more"]
    return texts
