"""Supervised background loops: an exception is one event, counted, and the loop runs again with
back-off; a loop failing run after run makes the plugin NotReady (never dead: a restart would not
cure what makes it fail), and one whose thread ended is dead to /healthz. Before, one exception ended the loop for good (the MPS
daemon watch died on EMFILE and never came back)."""

from __future__ import annotations

import errno
import logging

import pytest

from kubelet_plugin.periodic import Periodic
from testbed.waiting import wait_for


class Flaky:
    """A tick that fails with EMFILE ``failures`` times, then succeeds."""

    def __init__(self, failures: int) -> None:
        self.left = failures
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.left > 0:
            self.left -= 1
            raise OSError(errno.EMFILE, "Too many open files")


def test_a_failing_tick_is_logged_once_counted_and_retried_with_doubling_back_off(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    counted: list[str] = []
    loop = Periodic("mps-watch", 30.0, Flaky(4), on_failure=counted.append, node="n1")
    assert [loop.run_once() for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 30.0]  # the last run succeeded
    assert counted == ["mps-watch"] * 4
    events = [r for r in caplog.records if r.getMessage() == "loop_failed"]
    assert len(events) == 4 and not any(r.exc_info for r in events)  # one line each, no traceback
    assert events[0].kv == {"loop": "mps-watch", "node": "n1",  # type: ignore[attr-defined]
                            "error": "OSError: [Errno 24] Too many open files", "failures_in_a_row": 1,
                            "retry_in_s": 1.0}
    assert [r.getMessage() for r in caplog.records][-1] == "loop_recovered"


def test_three_failures_in_a_row_make_it_not_ready_and_a_success_ready_again() -> None:
    loop = Periodic("node-prerequisites", 10.0, Flaky(3))
    loop.run_once()
    loop.run_once()
    assert loop.failing() == ""  # one bad run is not worth a NotReady
    loop.run_once()
    assert loop.failing() == ("the node-prerequisites loop failed its last 3 runs "
                              "(last error: OSError: [Errno 24] Too many open files)")
    loop.run_once()
    assert loop.failing() == ""
    metrics_only = Periodic("vram-accounting", 15.0, Flaky(5), gates_readiness=False)
    for _ in range(5):
        metrics_only.run_once()
    assert metrics_only.failures == 5 and metrics_only.failing() == ""  # counted, never NotReady


def test_the_loop_keeps_running_after_an_exception_on_its_thread() -> None:
    tick = Flaky(2)
    loop = Periodic("mps-watch", 0.01, tick)
    loop.start()
    try:
        wait_for("runs after two failures", lambda: tick.calls >= 4, timeout=10)
        assert loop.dead_threads() == [] and loop.failures == 0
    finally:
        loop.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's end, on purpose
def test_a_loop_failing_run_after_run_is_not_dead_but_one_whose_thread_ended_is() -> None:
    failing = Periodic("rollback-retry", 0.01, Flaky(10**9))
    failing.start()
    try:
        wait_for("many failed runs", lambda: failing.failures >= 5, timeout=30)
        assert failing.dead_threads() == [] and failing.failing() != ""
    finally:
        failing.stop()
    assert failing.dead_threads() == []  # stopping is not dying

    def tick() -> None:
        raise SystemExit("a BaseException gets past the supervision")

    ended = Periodic("mps-watch", 0.01, tick)
    ended.start()
    assert ended._thread is not None
    ended._thread.join(timeout=5)
    assert ended.dead_threads() == ["mps-watch"]
