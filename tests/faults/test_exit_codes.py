"""``ac2`` exits with one documented code, every time, whatever the interpreter's teardown would do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pipelines.cli as cli
from ac2_core.launch import LaunchError
from pipelines import exits
from pipelines.cli import main
from tests.conftest import ROOT

AC2 = str(Path(sys.executable).parent / "ac2")


def _missing_input_argv(config: str, folder: Path) -> list[str]:
    gone = folder / "gone"
    return [
        "stage", "check_readiness", "--config", config,
        "--in", f"readiness={gone}/r", "--in", f"critic_pairs={gone}/c", "--in", f"scored_chunks={gone}/s",
        "--out", f"readiness={folder}/o1", "--out", f"advantages={folder}/o2",
    ]  # fmt: skip


def test_the_ac2_executable_exits_1_with_one_line_every_time(tmp_path):
    argv = [AC2, *_missing_input_argv(str(ROOT / "pipelines" / "configs" / "toy.yaml"), tmp_path)]
    for _ in range(3):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert (done.returncode, done.stderr) == (exits.FAILED, f"ac2: {tmp_path}/gone/c: no artifact at this URI\n")
    assert not (tmp_path / "o1").exists()


# What the interpreter's teardown may meet after a command has returned: a finalizer that aborts
# (as a native thread pool's destructor did: "terminate called without an active exception",
# rc 134), and a thread that never ends (a normal exit would wait for it forever).
TEARDOWN_HAZARDS = """
import os, runpy, sys, threading, time
class AbortsWhenFinalized:
    def __del__(self):
        os.abort()
hazard = AbortsWhenFinalized()
threading.Thread(target=time.sleep, args=(3600,)).start()
sys.argv = ["ac2", *sys.argv[1:]]
runpy.run_module("pipelines.cli", run_name="__main__")
"""


def test_an_error_exit_keeps_its_code_whatever_the_teardown_would_do(tmp_path):
    argv = _missing_input_argv(str(ROOT / "pipelines" / "configs" / "toy.yaml"), tmp_path)
    done = subprocess.run([sys.executable, "-c", TEARDOWN_HAZARDS, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert (done.returncode, done.stderr) == (exits.FAILED, f"ac2: {tmp_path}/gone/c: no artifact at this URI\n")


def test_usage_and_config_errors_exit_2(tmp_path, capsys):
    assert main(["run"]) == exits.USAGE  # --config is required
    assert "the following arguments are required: --config" in capsys.readouterr().err
    (bad := tmp_path / "bad.yaml").write_text("rollout: {group_size: -1}\n")
    assert main(["validate", "--config", str(bad)]) == exits.USAGE
    assert capsys.readouterr().err.startswith("ac2: ")


def test_an_interrupt_exits_130_and_a_bug_exits_1_with_one_line_or_its_traceback_under_debug(monkeypatch, capsys):
    def interrupted(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "load_config", interrupted)
    assert main(["validate", "--config", "x.yaml"]) == exits.INTERRUPTED
    assert capsys.readouterr().err == "ac2: interrupted\n"

    def bug(*_, **__):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(cli, "load_config", bug)
    assert main(["validate", "--config", "x.yaml"]) == exits.FAILED
    assert capsys.readouterr().err == "ac2: unexpected ZeroDivisionError: a bug (ac2 --debug ... shows the traceback)\n"
    assert main(["--debug", "validate", "--config", "x.yaml"]) == exits.FAILED
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.endswith("ZeroDivisionError: a bug\n")


def test_a_launched_process_that_failed_exits_1_with_one_line(monkeypatch, capsys):
    def failed(*_, **__):  # what launch.torchrun raises when a rank fails (its own traceback is above)
        raise LaunchError("update_actor over 2 processes, rank 1: out of memory (RuntimeError)")

    monkeypatch.setattr(cli, "load_config", failed)
    assert main(["validate", "--config", "x.yaml"]) == exits.FAILED
    assert capsys.readouterr().err == "ac2: update_actor over 2 processes, rank 1: out of memory (RuntimeError)\n"


@pytest.mark.parametrize("code", sorted(exits.MEANING))
def test_every_exit_code_is_documented_in_the_readme(code):
    readme = (ROOT / "README.md").read_text()
    assert f"| {code} |" in readme
