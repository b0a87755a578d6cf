"""Progress with elapsed time and ETA: plain lines off a terminal, a bar on one, the bootstrap's phases."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import termios

from ac2_core.runner import progress
from ac2_core.runner.progress import Progress, bootstrap_log


def test_plain_lines_carry_elapsed_time_and_an_eta_from_this_sessions_pace(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    lines: list[str] = []
    p = Progress("iterations", 10, log=lines.append, start=4, tty=False)  # a run resumed after iteration 4
    assert p.suffix() == "[4/10, elapsed 0:00, eta -]"
    now[0] += 30.0
    p.update(5, "row 5")
    now[0] += 30.0
    p.update(6, "row 6")
    # 2 iterations in 60 s, 4 left: 2 minutes
    assert lines == ["row 5   [5/10, elapsed 0:30, eta 2:30]", "row 6   [6/10, elapsed 1:00, eta 2:00]"]
    assert progress.clock(3725) == "1:02:05"


def test_on_a_terminal_a_bar_stays_below_the_lines():
    screen, lines = io.StringIO(), []
    p = Progress("iterations", 4, log=lines.append, tty=True, file=screen)
    p.update(1, "row 1")
    p.update(2, "row 2")
    p.close()
    assert lines == ["row 1", "row 2"]  # the rows themselves carry no figures: the bar has them
    assert "iterations" in screen.getvalue() and "2/4" in screen.getvalue()


def test_a_terminal_of_no_width_gets_the_plain_lines(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    leader, follower = pty.openpty()  # a pty nobody sized: 0 columns, as under `script` into a pipe
    with os.fdopen(follower, "w") as screen:
        assert screen.isatty() and os.get_terminal_size(follower).columns == 0
        lines: list[str] = []
        p = Progress("iterations", 2, log=lines.append, file=screen)
        p.update(1, "row 1")
        assert p.bar is None and lines[0].startswith("row 1   [1/2, elapsed ")
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # sized: a bar
        sized = Progress("iterations", 2, log=lines.append, file=screen)
        assert sized.bar is not None
        sized.close()
    os.close(leader)


def _through_bootstrap_log(monkeypatch, timed: list[tuple[float, str]]) -> list[str]:
    """What ``bootstrap_log`` prints, off a terminal, for each (clock seconds, bootstrap line)."""
    now = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    lines: list[str] = []
    sink, close = bootstrap_log(lines.append, tty=False)
    for seconds, line in timed:
        now[0] = seconds
        sink(line)
    close()
    return lines


def test_the_warm_starts_step_lines_become_progress_timed_from_its_first_line(monkeypatch):
    timed = [
        (0.0, "warm start: SFT on 64 worked solutions, 20 steps, stopping early at score 0.2"),
        (10.0, "warm start step 5/20 loss 5.255 score 0.00"),
        (20.0, "warm start step 10/20 loss 4.695 score 0.00"),
        (20.0, "warm start: 20 steps, sampled score 0.0"),
    ]
    assert _through_bootstrap_log(monkeypatch, timed) == [
        "warm start: SFT on 64 worked solutions, 20 steps, stopping early at score 0.2",
        "warm start step 5/20 loss 5.255 score 0.00   [5/20, elapsed 0:10, eta 0:30]",  # 2 s a step since the start
        "warm start step 10/20 loss 4.695 score 0.00   [10/20, elapsed 0:20, eta 0:20]",
        "warm start: 20 steps, sampled score 0.0",
    ]


def test_the_critic_reading_after_the_warm_start_gets_its_own_progress(monkeypatch):
    timed = [
        (0.0, "warm start: SFT on 64 worked solutions, 4 steps"),
        (4.0, "warm start step 4/4 loss 1.000 score 0.50"),
        (4.0, "warm start: 4 steps, sampled score 0.5"),  # the closing line starts nothing
        (10.0, "critic reading: 30 steps on 64 pairs of demonstrations"),
        (30.0, "critic reading step 10/30 loss 2.000"),
    ]
    assert _through_bootstrap_log(monkeypatch, timed) == [
        "warm start: SFT on 64 worked solutions, 4 steps",
        "warm start step 4/4 loss 1.000 score 0.50   [4/4, elapsed 0:04, eta 0:00]",
        "warm start: 4 steps, sampled score 0.5",
        "critic reading: 30 steps on 64 pairs of demonstrations",
        # timed from the reading's first line, not the warm start's: 2 s a step, 20 steps left
        "critic reading step 10/30 loss 2.000   [10/30, elapsed 0:20, eta 0:40]",
    ]
