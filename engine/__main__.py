"""The ``engine`` command (its console script, and ``python -m engine``): ``engine.cli.main.main``, then
an exit that skips tearing the interpreter down.

With the engine's libraries loaded, Python's own teardown (every module's namespace cleared, the
last collections) takes about 0.1 s, a tenth of a re-run served by the store. By then there is
nothing left for it to do: every artifact and record was written atomically and closed, and the
workers are ended. So this joins the threads that are still running (none, normally), runs the
exit handlers (logging's flush, temporary folders' cleanup) as the interpreter would, flushes
the standard streams and leaves with ``os._exit``. ``main`` itself returns normally, for callers
that import it (the tests)."""

from __future__ import annotations

import atexit
import os
import sys
import threading


def console() -> None:
    code = _main()  # an exception that escapes (a bug in main's own handling) ends Python the usual way
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # what the interpreter would run at exit: logging's flush, finalizers
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:  # the reader closed the pipe before the last of it (`engine ... | head`)
            from engine.cli.exits import closed_pipe

            code = closed_pipe()
        except (OSError, ValueError):  # a stream already closed: nothing more can be written
            pass
    os._exit(code)


def _main() -> int:
    from engine.cli.main import main

    try:
        return main()
    except SystemExit as done:  # argparse's --help and usage errors
        if done.code is None or isinstance(done.code, int):
            return done.code or 0
        print(done.code, file=sys.stderr)
        return 1


if __name__ == "__main__":
    console()
