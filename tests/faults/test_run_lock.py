"""One run at a time in a run folder: a second ``ac2 run`` stops naming the first, and the lock
of a run that was killed is taken over with a warning."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ac2_core import storage
from ac2_core.runner import lock
from ac2_core.storage.leftovers import alive
from pipelines import exits
from pipelines.cli import main
from tests.conftest import tiny_config
from tests.faults.conftest import Killed, config_yaml, local_files
from tests.storage.conftest import s3_for


def _wait_for(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.05)


def _dead_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.slow
def test_a_second_run_on_a_locked_folder_stops_naming_the_first_and_a_killed_ones_lock_is_taken_over(zygote, tmp_path, capfd):
    cfg = tiny_config(run__iterations=1)
    out = tmp_path / "run"
    argv = ["run", "--config", config_yaml(cfg, tmp_path), "--out", str(out), "--runner", "inprocess"]
    pause, ended = tmp_path / "paused", []
    first = threading.Thread(target=lambda: ended.append(_ends(zygote, argv, pause)))
    first.start()
    _wait_for(lambda: pause.exists() or ended, "the first run to reach its first publish")
    assert not ended, ended
    pid = int(pause.read_text())
    try:
        capfd.readouterr()
        assert main(argv) == exits.RUN_FOLDER
        err = capfd.readouterr().err
        holder = f"pid {pid} on {socket.gethostname()}, started "
        assert err.startswith(f"ac2: {out}: another run is writing to this run folder: {holder}"), err
        assert re.search(r"started \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", err) and "run --config" in err
        assert err.count("\n") == 1
    finally:
        os.kill(pid, 9)  # the first run dies holding the lock, mid-publish
        first.join(timeout=60)
    assert ended == ["killed"]
    _wait_for(lambda: not alive(pid), "the killed run to be reaped")
    assert Path(out, "run.lock").exists() and any(".staging-" in f for f in local_files(str(out)))

    assert main(argv) == exits.OK
    said = capfd.readouterr().out
    assert f"warning: {out} was locked by pid {pid} on {socket.gethostname()}" in said
    assert "which is no longer running; taking its lock over" in said
    assert re.search(rf"removed {out}/bootstrap/\.problems\.staging-\S+-{pid}-\w+: left by a run that was killed", said)
    assert not Path(out, "run.lock").exists()
    assert not any(".staging-" in f for f in local_files(str(out)))


def _ends(zygote, argv, pause: Path) -> str:
    """How a run paused at its first publish ended: killed, as the test means it to be, or otherwise."""
    try:
        return f"exit {zygote.ac2(argv, kill_at='pause', pause_file=str(pause))}"
    except Killed:
        return "killed"
    except Exception as e:  # noqa: BLE001 - reported by the test
        return repr(e)


def test_a_lock_file_nobody_holds_is_taken_over_and_removed_at_the_end(tmp_path):
    (tmp_path / lock.LOCK).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "t", "command": "c", "token": "x"}))
    said = []
    with lock.held(str(tmp_path), log=said.append) as me:
        assert json.loads((tmp_path / lock.LOCK).read_text())["pid"] == me.pid == os.getpid()
        with pytest.raises(lock.RunFolderLocked, match=rf"pid {os.getpid()} on {socket.gethostname()}"):
            with lock.held(str(tmp_path), log=said.append):
                pass
    assert said == [
        f"warning: {tmp_path} was locked by pid 1 on elsewhere, started t (c), which is no longer running; taking its lock over"
    ]
    assert not (tmp_path / lock.LOCK).exists()


def test_a_run_folder_on_s3_is_locked_and_a_dead_local_holder_is_taken_over(seaweed, clean_aws_env):
    with s3_for(seaweed, clean_aws_env, "lock") as s3:
        out, said = s3.uri("run"), []
        with lock.held(out, log=said.append):
            with pytest.raises(
                lock.RunFolderLocked,
                match=rf"pid {os.getpid()} on .*; wait for it to end; if that run is gone, delete {out}/run.lock",
            ):
                with lock.held(out, log=said.append):
                    pass
        assert s3.objects(out) == [] and said == []

        dead = _dead_pid()
        stale = {"pid": dead, "host": socket.gethostname(), "started": "t", "command": "ac2 run", "token": "x"}
        s3.server.client().pipe_file(f"{out.removeprefix('s3://')}/run.lock", json.dumps(stale).encode())
        with lock.held(out, log=said.append):
            assert json.loads(s3.server.client().cat_file(f"{out.removeprefix('s3://')}/run.lock"))["pid"] == os.getpid()
        holder = f"pid {dead} on {socket.gethostname()}, started t (ac2 run)"
        assert said == [f"warning: {out}/run.lock was left by {holder}, which is no longer running; taking it over"]

        elsewhere = dict(stale, host="another-machine")
        s3.server.client().pipe_file(f"{out.removeprefix('s3://')}/run.lock", json.dumps(elsewhere).encode())
        with pytest.raises(lock.RunFolderLocked, match=f"pid {dead} on another-machine"):
            with lock.held(out):
                pass
        assert storage.exists(out) is False  # a lock is not an artifact
