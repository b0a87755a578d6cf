"""A stage's launched processes (torchrun's agent and workers, spawned shards) die with the stage's
process, however it dies, and the next run removes the scratch folder it leaves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ac2_core.storage.leftovers import alive, remove_temp_leftovers
from tests.conftest import ROOT

# A stand-in for a stage's process: it launches two processes of tests.faults.launched, which wait.
STAGE = """
import sys
from ac2_core import launch
with launch.scratch("update_actor") as folder:
    launch.write_spec(folder, {})
    print(folder, flush=True)
    if sys.argv[1] == "torchrun":
        launch.torchrun("tests.faults.launched", folder, 2, threads_each=1, what="test")
    else:
        launch.spawn("tests.faults.launched", folder, None, 2, threads_each=1, what="test")
"""


def _pids_of(folder: Path) -> list[int]:
    """The launched processes: the workers' recorded pids, and any process whose command names ``folder``."""
    pids = [int(p.read_text()) for p in folder.glob("pid-*")]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(folder).encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return sorted(set(pids))


@pytest.mark.parametrize("how", ["torchrun", "spawn"])
def test_launched_processes_die_with_the_stage_process_and_their_folder_is_swept(how):
    stage = subprocess.Popen([sys.executable, "-c", STAGE, how], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    pids: list[int] = []
    try:
        folder = Path(stage.stdout.readline().strip())
        assert folder.name.startswith(".update_actor.launch-")
        deadline = time.monotonic() + 180  # torchrun's agent and workers each import torch
        while len(list(folder.glob("pid-*"))) < 2 and time.monotonic() < deadline:
            assert stage.poll() is None, f"the launch ended with {stage.returncode}"
            time.sleep(0.2)
        pids = [p for p in _pids_of(folder) if p != stage.pid]
        assert len(pids) == (3 if how == "torchrun" else 2)  # torchrun: its agent too
        os.kill(stage.pid, signal.SIGKILL)  # the stage's process alone: no handler, no group signal
        stage.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in pids if alive(p)] == []
        assert str(folder) in remove_temp_leftovers()  # the next run's sweep: its process is gone
        assert not folder.exists()
    finally:
        if stage.poll() is None:
            stage.kill()
        for p in pids:  # a failed test must not leave them running
            if alive(p):
                os.kill(p, signal.SIGKILL)
