"""tests/alone.py: under xdist a test marked ``alone`` runs with no other test beside it, and the
other tests cannot starve it."""

from __future__ import annotations

import threading
import uuid

from alone import machine
from holders import hold_in_thread

WAIT_S = 0.3


def _holder(run_id: str, alone: bool, log: list[str], name: str, release: threading.Event) -> threading.Thread:
    return hold_in_thread(lambda: machine(run_id, alone), log, name, release)


def test_an_alone_test_waits_for_the_others_and_the_next_ones_wait_for_it() -> None:
    run_id, log = uuid.uuid4().hex, []
    first, solo, second = threading.Event(), threading.Event(), threading.Event()
    shared = _holder(run_id, False, log, "shared", first)
    threading.Event().wait(WAIT_S)
    alone = _holder(run_id, True, log, "alone", solo)
    threading.Event().wait(WAIT_S)
    assert log == ["shared in"]  # the alone test waits while another test runs
    later = _holder(run_id, False, log, "later", second)
    threading.Event().wait(WAIT_S)
    assert log == ["shared in"]  # and a test that asks after it waits behind it (the turnstile)
    first.set()
    shared.join(5)
    threading.Event().wait(WAIT_S)
    assert log == ["shared in", "shared out", "alone in"]  # alone: the later test still waits
    solo.set()
    alone.join(5)
    second.set()
    later.join(5)
    assert log == ["shared in", "shared out", "alone in", "alone out", "later in", "later out"]


def test_other_tests_run_side_by_side_and_nothing_is_locked_without_xdist() -> None:
    for run_id, alone in ((uuid.uuid4().hex, False), (None, True)):
        log: list[str] = []
        release = threading.Event()
        threads = [_holder(run_id, alone, log, name, release) for name in ("a", "b")]  # type: ignore[arg-type]
        threading.Event().wait(WAIT_S)
        assert sorted(log) == ["a in", "b in"], run_id
        release.set()
        for thread in threads:
            thread.join(5)


def test_a_workflows_timing_waits_for_quiet_as_the_environment_says(monkeypatch) -> None:
    import pytest

    from engine.core.errors import InputError
    from evaluators.latency import Latency

    monkeypatch.delenv("KILN_QUIET_WAIT_S", raising=False)
    assert Latency.Config().quiet_wait_s == 30.0
    monkeypatch.setenv("KILN_QUIET_WAIT_S", "0")
    assert Latency.Config().quiet_wait_s == 0.0
    assert Latency.Config(quiet_wait_s=5).quiet_wait_s == 5.0  # the workflow's own value wins
    monkeypatch.setenv("KILN_QUIET_WAIT_S", "soon")
    with pytest.raises(InputError, match="KILN_QUIET_WAIT_S") as raised:
        Latency.Config()
    assert "'soon'" in str(raised.value) and "fix:" in str(raised.value)
