"""Progress with elapsed time and ETA: the bootstrap's warm start and critic reading, and a run's iterations.

On a terminal a tqdm bar stays at the bottom while the run's lines scroll above it; where
the output is not a terminal (a file, CI, kfp.local's task log) each update is one plain
line with the same figures, so a log reads the same without control codes. The ETA is the
mean time per step (or iteration) done in this session times the number left.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable

Log = Callable[[str], None]

# The bootstrap's phases of planned length: each one's first line (``stages.bootstrap``), which
# starts its clock, and its report lines (``training.sft``: the step and the planned length).
PHASES = ("warm start", "critic reading")
PHASE_BEGINS = (
    ("warm start", re.compile(r"^warm start: SFT on .*?\b(\d+) steps\b")),
    ("critic reading", re.compile(r"^critic reading: (\d+) steps\b")),
)
PHASE_STEP = re.compile(rf"^({'|'.join(PHASES)}) step (\d+)/(\d+)\b")


def clock(seconds: float) -> str:
    """``m:ss`` or ``h:mm:ss``."""
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def _draws_a_bar(file) -> bool:
    """A terminal that reports a width: on one of 0 columns (a pty nobody sized: ``script`` into a
    pipe, some CI runners) tqdm draws nothing, so the figures go at the end of the lines instead."""
    if not file.isatty():
        return False
    try:
        return os.get_terminal_size(file.fileno()).columns > 0
    except (OSError, ValueError):
        return False


class Progress:
    """``total`` steps of work, ``start`` of them already done (a resumed run)."""

    def __init__(self, label: str, total: int, *, log: Log, start: int = 0, tty: bool | None = None, file=None, unit="it"):
        self.label, self.total, self.start, self.log = label, total, start, log
        self.file = file if file is not None else sys.stderr
        self.tty = _draws_a_bar(self.file) if tty is None else tty
        self.t0 = time.perf_counter()
        self.done = start
        self.bar = None
        if self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, desc=label, unit=unit, file=self.file, dynamic_ncols=True, leave=False)

    def figures(self) -> tuple[float, float | None]:
        """(seconds since this session started, estimated seconds left or None before the first step)."""
        elapsed = time.perf_counter() - self.t0
        ran = self.done - self.start
        return elapsed, (elapsed / ran * (self.total - self.done) if ran > 0 else None)

    def suffix(self) -> str:
        elapsed, left = self.figures()
        eta = "-" if left is None else clock(left)
        return f"[{self.done}/{self.total}, elapsed {clock(elapsed)}, eta {eta}]"

    def update(self, done: int, line: str | None = None) -> None:
        """Mark ``done`` steps finished; print ``line`` (with the figures, where there is no bar)."""
        self.done = done
        if self.bar is None:
            if line is not None:
                self.log(f"{line}   {self.suffix()}")
            return
        self.bar.n = done
        self.bar.refresh()
        if line is not None:
            self.write(line)

    def write(self, line: str) -> None:
        """Print ``line`` above the bar (as is, where there is none)."""
        if self.bar is None:
            self.log(line)
            return
        from tqdm import tqdm

        with tqdm.external_write_mode(file=self.file):
            self.log(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def bootstrap_log(log: Log, *, tty: bool | None = None, file=None) -> tuple[Log, Callable[[], None]]:
    """A ``log`` for the bootstrap that turns the step lines of its phases (the warm start, the
    critic's reading) into a progress display each, with elapsed time and ETA over the phase's
    planned steps; other lines pass through. Returns it and the function that closes the display."""
    state: dict[str, tuple[str, Progress]] = {}

    def start(label: str, total: int, done: int = 0) -> None:
        close()
        state["p"] = (label, Progress(label, total, log=log, start=done, tty=tty, file=file, unit="step"))

    def sink(line: str) -> None:
        for label, begins in PHASE_BEGINS:
            if label != _current() and (m := begins.match(line)):
                start(label, int(m.group(1)))
        m = PHASE_STEP.match(line)
        if m is None:
            (state["p"][1].write if "p" in state else log)(line)
            return
        label, step, total = m.group(1), int(m.group(2)), int(m.group(3))
        if label != _current():  # no first line seen: the clock starts here, the ETA at the next step
            start(label, total, step)
        state["p"][1].update(step, line)

    def _current() -> str | None:
        return state["p"][0] if "p" in state else None

    def close() -> None:
        if "p" in state:
            state.pop("p")[1].close()

    return sink, close
