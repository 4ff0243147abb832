"""The exit codes of the `engine` command, and the two ends that are not a command's own result:
an engine bug (its traceback kept in a file) and a reader that closed the output pipe."""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from engine import __version__

EXIT_OK, EXIT_NO_CHOICE, EXIT_BAD_INPUT, EXIT_BUG, EXIT_STORE_DAMAGED = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130
#: 128 + SIGPIPE: what a shell reports for a command that a closed pipe ended (`engine schema | head`)
EXIT_CLOSED_PIPE = 141


def report_bug(error: BaseException) -> int:
    """An error Kiln did not raise on purpose: say so, keep the traceback in a file, exit 3."""
    folder = Path(os.environ.get("KILN_LOG_DIR") or tempfile.gettempdir())
    path = folder / f"kiln-crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(f"kiln {__version__}, argv {sys.argv}\n" + "".join(traceback.format_exception(error)), encoding="utf-8")
        where = f"the traceback is in {path}"
    except OSError:
        traceback.print_exception(error)
        where = "the traceback is above"
    print(
        f"internal error: {type(error).__name__}: {error}\nthis is a bug in Kiln; {where}. Please report it with that traceback.",
        file=sys.stderr,
    )
    return EXIT_BUG


def closed_pipe() -> int:
    """The reader of the output went away (`engine schema | head`): its choice, not a failure of
    Kiln. Nothing is printed (there is no one to read it) and no crash log is written; standard
    output is pointed at /dev/null so that the last flush before exit cannot raise again. Exits
    141, as a command killed by SIGPIPE does (Python ignores SIGPIPE, so it sees the error
    instead)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # not a real file (captured output): nothing to redirect
            pass
    return EXIT_CLOSED_PIPE
