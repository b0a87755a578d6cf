"""Trackers under Ctrl-C: a write is never torn, and a second Ctrl-C is never held."""

from __future__ import annotations

import os
import signal

import pytest

from ac2_core.runner.tracking import Trackers
from tests.conftest import tiny_config


class Sink:
    """A tracker that is interrupted ``presses`` times while it writes, and records how far it got."""

    def __init__(self, presses: int = 0):
        self.presses = presses
        self.written: list[int] = []
        self.closed = False

    def press(self) -> None:
        for _ in range(self.presses):
            os.kill(os.getpid(), signal.SIGINT)  # handled before os.kill returns, in this (the main) thread

    def log(self, step: int, values: dict[str, float]) -> None:
        self.press()
        self.written.append(step)

    def close(self) -> None:
        self.press()
        self.closed = True


def trackers(*sinks: Sink) -> Trackers:
    t = Trackers(tiny_config(tracking__tensorboard=False), "unused")
    t.sinks = list(sinks)
    return t


@pytest.fixture(autouse=True)
def python_handles_sigint():
    # a suite started in the background ignores SIGINT, and these tests need Python's handler
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_while_trackers_write_is_raised_once_every_tracker_has_written():
    first, second = Sink(presses=1), Sink()
    with pytest.raises(KeyboardInterrupt):
        trackers(first, second).log({"iteration": 3, "val_score": 0.5})
    assert (first.written, second.written) == ([3], [3])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_is_raised_at_once():
    stuck, after = Sink(presses=2), Sink()
    with pytest.raises(KeyboardInterrupt):
        trackers(stuck, after).log({"iteration": 3, "val_score": 0.5})
    assert (stuck.written, after.written) == ([], [])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_close_finishes_every_tracker_before_the_interrupt():
    sinks = Sink(presses=1), Sink()
    with pytest.raises(KeyboardInterrupt):
        trackers(*sinks).close()
    assert all(s.closed for s in sinks)
