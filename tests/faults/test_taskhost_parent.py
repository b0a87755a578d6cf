"""The kfp runner's warm task host dies with the process that started it, however that one dies,
and removes its socket folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ac2_core.storage.leftovers import alive
from tests.conftest import ROOT

# A stand-in for `ac2 run`: starts the task host as the kfp runner does, prints its address, waits.
PARENT = """
import sys, time
from pathlib import Path
from pipelines import local, taskhost
with local.warm_task_host(Path(sys.argv[1])) as address:
    if sys.argv[2] == "serving":
        taskhost.wait_ready(address)
    print(address, flush=True)
    time.sleep(600)
"""


def _host_pid(address: str) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"pipelines.taskhost" in cmdline and address.encode() in cmdline:
                return int(entry.name)
    raise AssertionError(f"no task host serves {address}")


@pytest.mark.parametrize("phase", ["importing", "serving"])
def test_the_task_host_stops_and_removes_its_socket_folder_when_its_parent_is_killed(tmp_path, phase):
    log = tmp_path / "taskhost.log"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(log), phase], stdout=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True
    )
    host = None
    try:
        address = parent.stdout.readline().strip()
        host = _host_pid(address)
        os.killpg(parent.pid, signal.SIGKILL)  # the whole of `ac2 run`'s process group, as a user's kill -9 would
        parent.wait(timeout=30)
        deadline = time.monotonic() + 60
        while alive(host) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(host), f"the task host (pid {host}) outlived its parent"
        assert not Path(address).parent.exists()
        assert "the process that started it is gone; stopping" in log.read_text()
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
        if host is not None and alive(host):  # a failed test must not leave it running
            os.kill(host, signal.SIGKILL)
