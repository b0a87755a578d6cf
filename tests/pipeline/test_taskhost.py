"""The warm task host (``pipelines.taskhost``, the task's side in ``components.taskhost``):
a worker per call that is the task's process in all that a stage sees, failures that read
as without a host, and a host that is stopped with its workers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ac2_core.storage import ArtifactError
from components import taskhost as task_side
from pipelines import local, taskhost
from tests.pipeline import taskhost_targets as targets


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    folder = tmp_path_factory.mktemp("taskhost")
    with local.warm_task_host(folder / "taskhost.log") as address:
        taskhost.wait_ready(address)
        yield SimpleNamespace(address=address, log=folder / "taskhost.log")


def call(host, target: str, **kwargs):
    return task_side.call(getattr(targets, target), kwargs, address=host.address)


def test_a_worker_is_a_new_process_with_the_tasks_output_environment_and_directory(host, capfd, monkeypatch, tmp_path):
    monkeypatch.setenv("AC2_TEST_PROBE", "set by the task")
    monkeypatch.chdir(tmp_path)
    first, second = call(host, "echo", value=[1, "two"]), call(host, "echo", value=None)
    assert first["value"] == [1, "two"] and second["value"] is None
    assert first["probe"] == "set by the task" and first["cwd"] == str(tmp_path)
    assert first["numpy_float"] == 0.5
    # a fresh process per call, both forked by the same host (not this process)
    assert len({first["pid"], second["pid"], os.getpid()}) == 3
    assert first["ppid"] == second["ppid"] != os.getpid()
    out, err = capfd.readouterr()  # the worker wrote to this process's own stdout and stderr
    assert out.count(f"stdout {targets.MARK}") == 2 and err.count(f"stderr {targets.MARK}") == 2
    assert "imports done" in host.log.read_text()


def test_a_stage_error_is_raised_as_its_own_class_with_the_traceback_printed(host, capfd):
    with pytest.raises(ArtifactError) as raised:
        call(host, "fail_artifact", message="/x: data.parquet does not match its manifest")
    assert raised.value.args == ("/x: data.parquet does not match its manifest",)
    assert "traceback is printed above" in raised.value.__notes__[0]
    assert "in fail_artifact" in capfd.readouterr().err
    with pytest.raises(RuntimeError, match=r"^KeyError: 'missing'$"):  # a class that alters its message
        call(host, "fail_keyerror")


def test_a_worker_that_dies_is_reported_and_the_host_serves_on(host):
    with pytest.raises(RuntimeError, match=r"worker for tests.pipeline.taskhost_targets:die died before it replied"):
        call(host, "die")
    assert call(host, "echo", value=1)["value"] == 1


def test_without_a_host_the_task_runs_the_stage_itself(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(task_side.ENV, str(tmp_path / "gone" / "socket"))
    result = task_side.call_or_run(targets.echo, {"value": 7}, label="stage echo")
    assert result["value"] == 7 and result["pid"] == os.getpid() and result["numpy_float"] == 0.5
    err = capfd.readouterr().err
    assert f"no task host at {tmp_path / 'gone' / 'socket'}" in err and "running stage echo in the task's own process" in err


def test_stopping_the_host_stops_its_running_workers(tmp_path):
    pid_file, outcome = tmp_path / "worker.pid", {}

    def task(address):
        try:
            task_side.call(targets.wait, {"pid_file": str(pid_file)}, address=address)
        except RuntimeError as e:
            outcome["error"] = str(e)

    before = os.environ.get(task_side.ENV)
    with local.warm_task_host(tmp_path / "taskhost.log") as address:
        assert os.environ[task_side.ENV] == address
        thread = threading.Thread(target=task, args=(address,))
        thread.start()
        deadline = time.monotonic() + 120
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        worker = int(pid_file.read_text())
    thread.join(timeout=30)
    assert "died before it replied" in outcome["error"]
    assert not Path(address).parent.exists() and os.environ.get(task_side.ENV) == before
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_task_with_a_host_imports_nothing_heavy():
    # what a component body imports before it hands its call over (the rest is the host's)
    probe = (
        "import sys, kfp.dsl.executor_main, components.io, components.taskhost, ac2_core.stages.recipe;"
        "print(sorted(m for m in ('torch', 'transformers', 'pyarrow', 'pydantic', 'numpy', 'fsspec') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env={**os.environ, "_KFP_RUNTIME": "true"}
    ).stdout
    assert out.strip() == "[]"


def test_a_large_environment_reaches_the_worker_whole(host, monkeypatch):
    monkeypatch.setenv("AC2_TEST_PROBE", "x" * 600_000)  # the call carries the environment: it must fit, whole
    assert call(host, "echo", value=0)["probe"] == "x" * 600_000


def test_a_task_runs_new_code_itself_when_the_hosts_sources_changed(tmp_path, capfd):
    from ac2_core.stages import recipe  # imported by the host; only its modification time changes here

    source = Path(recipe.__file__)
    before = source.stat()
    with local.warm_task_host(tmp_path / "taskhost.log") as address:
        taskhost.wait_ready(address)
        assert task_side.call_or_run(targets.echo, {"value": 1}, label="stage echo")["pid"] != os.getpid()  # a worker
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
        try:
            result = task_side.call_or_run(targets.echo, {"value": 2}, label="stage echo")
        finally:
            os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert result["value"] == 2 and result["pid"] == os.getpid()  # as a cold task would: with the code on disk now
    err = capfd.readouterr().err
    assert f"refused the call: {source} changed since the host imported it; running stage echo" in err
