"""Keep OpenVINO's converter and NNCF quiet and offline while a pass runs.

- **Telemetry.** ``import openvino``, ``openvino.convert_model`` and NNCF record and send usage
  statistics through ``openvino_telemetry`` unless the user opted out. A pass never reaches the
  network: ``targets.openvino.decline_telemetry`` (re-exported here) declines for the process, and
  must run before openvino or nncf is first imported.
- **Output.** NNCF logs INFO to stdout through its own handler (``nncf`` logger, not
  propagated) and draws rich progress bars on stdout; torch's tracer and NNCF raise Python
  warnings. ``library_output`` collects all three while a block runs, so the pass can report
  them, and the console stays clean.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

from passes.common.library_logs import LibraryMessage, LogCollector, cap
from targets.openvino import decline_telemetry

__all__ = ["LibraryMessage", "LibraryOutput", "decline_telemetry", "library_output"]


@dataclass
class LibraryOutput:
    messages: list[LibraryMessage] = field(default_factory=list)

    def lines(self, min_level: int = logging.WARNING, limit: int = 20) -> list[str]:
        """Distinct messages at ``min_level`` or above, in first-seen order, at most ``limit``."""
        seen: dict[str, None] = {}
        for m in self.messages:
            if logging.getLevelName(m.level) >= min_level:
                seen.setdefault(f"{m.level}: {m.message.splitlines()[0][:300] if m.message else ''}", None)
        return cap(list(seen), limit)

    def texts(self, source: str) -> list[str]:
        return [m.message for m in self.messages if m.source == source]


@contextlib.contextmanager
def library_output(nncf_level: int = logging.INFO) -> Iterator[LibraryOutput]:
    """Collect the nncf logger's records (``nncf_level`` and above), Python warnings and anything
    printed on stdout while the block runs; restore everything afterwards."""
    decline_telemetry()
    output = LibraryOutput()
    nncf_logger = logging.getLogger("nncf")
    saved_handlers, saved_level = list(nncf_logger.handlers), nncf_logger.level
    collector = LogCollector(logging.DEBUG)
    collector.messages = output.messages
    nncf_logger.handlers = [collector]
    nncf_logger.setLevel(nncf_level)
    printed = io.StringIO()
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as recorded, contextlib.redirect_stdout(printed):
            warnings.simplefilter("always")
            caught = recorded
            yield output
    finally:
        nncf_logger.handlers = saved_handlers
        nncf_logger.setLevel(saved_level)
        for warning in caught:
            output.messages.append(LibraryMessage("warnings", "WARNING", f"{warning.category.__name__}: {warning.message}"))
        text = printed.getvalue().strip()
        if text:
            output.messages.append(LibraryMessage("stdout", "INFO", text[-2000:]))
