"""What the fault tests run in a process of its own: ``ac2`` commands, killed at a chosen point.

A test calls these through a warm task host (``pipelines.taskhost``: the imports are paid
once, each call is a fresh forked process), or as ``python -m tests.faults.targets`` where
a run must own its process group (the kfp runner). ``kill_at`` names a point of the real
storage code and which occurrence of it ends the process with SIGKILL, as a crash would:
no ``finally``, no exit handler, nothing flushed.

    publish      before the rename that makes a local artifact visible (staged in full)
    replaced     after a published artifact was renamed aside, before the new one takes its name
    published    after the rename that made a local artifact visible, before the old copy is deleted
    manifest     before an object store's manifest upload: every data object is up, the old manifest gone
    uploaded     after the first data object of an object-store publish is up
    move         before the kfp runner moves a finished pipeline run's output to the run folder
    pause        not a kill: write ``pause_file`` and wait (up to 120 s) until it is deleted
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from ac2_core import storage
from ac2_core.storage import artifacts


def _crash() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class _Counter:
    def __init__(self, point: str, nth: int, pause_file: str | None):
        self.point, self.nth, self.pause_file, self.seen = point, nth, pause_file, 0

    def hit(self, point: str) -> None:
        if point != self.point:
            return
        self.seen += 1
        if self.seen != self.nth:
            return
        if self.point != "pause":
            _crash()
        Path(self.pause_file).write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while Path(self.pause_file).exists() and time.monotonic() < deadline:
            time.sleep(0.05)


def install(point: str, nth: int, pause_file: str | None = None) -> None:
    """Patch the storage code of this process so that the ``nth`` occurrence of ``point`` crashes (or pauses) it."""
    counter = _Counter(point, nth, pause_file)
    rename = os.rename

    def watched_rename(src, dst, *args, **kwargs):
        src_name, dst_name = os.path.basename(src), os.path.basename(dst)
        if ".staging-" in src_name:
            counter.hit("publish")
            counter.hit("pause")
        rename(src, dst, *args, **kwargs)
        if ".old-" in dst_name:
            counter.hit("replaced")
        if ".staging-" in src_name:
            counter.hit("published")

    os.rename = watched_rename  # Path.rename calls os.rename
    call = artifacts.call

    def watched_call(t, what, method, *args, **kwargs):
        if what == "upload of manifest.json":
            counter.hit("manifest")
            counter.hit("pause")
        result = call(t, what, method, *args, **kwargs)
        if what.startswith("upload of ") and what != "upload of manifest.json":
            counter.hit("uploaded")
        return result

    artifacts.call = watched_call
    move = storage.move

    def watched_move(src, dst):
        counter.hit("move")
        move(src, dst)

    storage.move = watched_move  # as pipelines.local calls it


def ac2(
    *,
    argv: list[str],
    kill_at: str | None = None,
    nth: int = 1,
    pause_file: str | None = None,
    pid_file: str | None = None,
    tempdir: str | None = None,
):
    """``ac2 <argv>`` in this process, crashed at the ``nth`` ``kill_at`` point if one is given; its exit code.
    ``tempdir``: this process's temp folder (staging of remote publishes, model downloads)."""
    import tempfile

    from pipelines.cli import main

    sys.argv = ["ac2", *argv]  # as the executable would see them (the run lock records its command)
    if tempdir:
        tempfile.tempdir = tempdir
    if pid_file:
        Path(pid_file).write_text(str(os.getpid()))
    if kill_at:
        install(kill_at, nth, pause_file)
    return main(argv)


if __name__ == "__main__":  # python -m tests.faults.targets POINT NTH -- ARGV...: the executable's way out
    from pipelines import cli

    point, nth, _, *argv = sys.argv[1:]
    install(point, int(nth))
    sys.argv = ["ac2", *argv]
    cli.console()
