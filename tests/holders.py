"""A lock held in a thread of its own, for tests of lock order (tests/contracts/test_alone.py,
tests/engine/test_host_lock.py): the thread logs when it gets in and when it lets go."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager


def hold_in_thread(
    held: Callable[[], AbstractContextManager[object]], log: list[str], name: str, release: threading.Event
) -> threading.Thread:
    """Start a thread that enters ``held()``, logs ``NAME in``, waits for ``release`` (10 s at most),
    logs ``NAME out`` and leaves."""

    def hold() -> None:
        with held():
            log.append(f"{name} in")
            release.wait(10)
            log.append(f"{name} out")

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    return thread
