"""A stage's launched processes (torchrun's agent and workers, spawned shards) die with the stage's
process, however it dies, and the next run removes the scratch folder it leaves, and goes past a
build of DeepSpeed's op that one of them was killed in."""

from __future__ import annotations

import os
import shutil
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


# What a DeepSpeed stage's process does before DeepSpeed sets up its communication; prints where it built.
LOAD_OPS = """
from ac2_core.training.deepspeed_backend import build_ops, extensions_dir
build_ops()
print(extensions_dir(), flush=True)
"""
# turns a wait for a lock that nobody will release into a failure: a load with nothing to
# build imports DeepSpeed (seconds); a first build compiles two C++ files (minutes on 2 busy cores)
HANG_S = 900


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


def _load_ops(env: dict[str, str], what: str) -> str:
    try:
        done = subprocess.run([sys.executable, "-c", LOAD_OPS], env=env, cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what}: still waiting after {HANG_S} s (torch's lock file of a killed build?)")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_build_of_deepspeeds_op_killed_with_its_stage_stops_no_later_stage(tmp_path):
    """A rank killed (with its stage) while it JIT-builds DeepSpeed's communication op leaves torch's
    lock file in the build folder, and torch waits for that file to go, asleep, without end: a
    2-process ZeRO update sat in ``FileBaton.wait`` for good. ``build_ops`` goes past it."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install 'ac2[deepspeed]')")
    # built once in this environment's own folder (not the one torch's default shares among environments)
    built = Path(_load_ops(dict(os.environ), "the op in this environment's folder"))
    assert built.name.startswith("ac2-"), built
    # the same build in a folder of the test's, with the lock file that a killed build leaves
    ours = tmp_path / built.name
    shutil.copytree(built / "deepspeed_shm_comm", ours / "deepspeed_shm_comm")  # file times kept: nothing to rebuild
    (ours / "deepspeed_shm_comm" / "lock").touch()
    env = os.environ | {"TORCH_EXTENSIONS_DIR": str(tmp_path)}
    assert _load_ops(env, "the op beside a killed build's lock file") == str(ours)
    assert not (ours / "deepspeed_shm_comm" / "lock").exists()
