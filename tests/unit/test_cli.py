"""The command line as a user meets it: --version, a description for every command, "did you
mean" for misspelt flags and commands, one-line errors with their exit codes, and Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from ac2_core.runner import record
from pipelines import exits
from pipelines.cli import build_parser, main
from tests.conftest import ROOT, tiny_config


def _usage_error(argv: list[str], capsys) -> str:
    assert main(argv) == exits.USAGE
    err = capsys.readouterr().err.strip()
    assert "\n" not in err  # one line, no usage block
    return err


def test_version(capsys):
    assert main(["--version"]) == exits.OK and capsys.readouterr().out.strip() == "ac2 0.1.0"


def test_every_command_has_a_description():
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(sub.choices) == {"run", "validate", "plan", "compile", "submit", "stage", "report", "lineage"}
    for name, parser in sub.choices.items():
        assert parser.description and len(parser.description) > 40, name


def test_a_misspelt_flag_or_command_gets_a_did_you_mean(capsys):
    err = _usage_error(["run", "--config", "c.yaml", "--iteratons", "3"], capsys)
    assert "unrecognized arguments: --iteratons 3; did you mean --iteratons -> --iterations?" in err
    assert "did you mean 'run'?" in _usage_error(["rnu", "--config", "c.yaml"], capsys)
    assert "did you mean 'inprocess'?" in _usage_error(["run", "--config", "c.yaml", "--runner", "inproces"], capsys)


def test_a_bad_number_for_ac2_plan_is_a_usage_error_naming_the_flag(capsys):
    assert "argument --gpus: must be at least 1, found 0" in _usage_error(["plan", "--config", "c.yaml", "--gpus", "0"], capsys)
    err = _usage_error(["plan", "--config", "c.yaml", "--gpus", "8", "--ready-share", "1.5"], capsys)
    assert "argument --ready-share: expected a number from 0 to 1, found 1.5" in err


def test_errors_are_one_line_with_their_exit_code(tmp_path, capsys, monkeypatch):
    assert main(["report", str(tmp_path / "nowhere")]) == exits.FAILED
    err = capsys.readouterr().err.strip()
    assert err == f"ac2: {tmp_path / 'nowhere'}: no finished iteration (no iter-*/evaluate/metrics)"
    # an s3:// run folder is read as one: without credentials the error names the URI as given
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    assert main(["report", "s3://bucket/run"]) == exits.FAILED
    err = capsys.readouterr().err.strip()
    assert err.startswith("ac2: s3://bucket/run/") and "no S3 credentials" in err and "\n" not in err
    # a config error lists its fields on one line, exit 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: {group_size: 0}\nactor: {lr: -1}\n")
    assert main(["validate", "--config", str(bad)]) == exits.USAGE
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "rollout.group_size" in err and "actor.lr" in err


def test_ctrl_c_prints_one_line_saying_how_to_resume(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(record.config_yaml(tiny_config(run__iterations=200)))
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "pipelines.cli", "run", "--config", str(config), "--out", str(out), "--runner", "inprocess"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # SIGINT at its default in the child: a suite started in the background (``make test &``)
    # ignores SIGINT, children inherit that, and Python then installs no KeyboardInterrupt
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 300
    for line in proc.stdout:  # interrupt once the first iteration is done
        if "[1/200" in line or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == exits.INTERRUPTED
    assert "Traceback" not in err
    (last,) = [line for line in err.splitlines() if line.startswith("ac2:")]
    assert last.startswith(f"ac2: interrupted; run the same command again to resume {out} after iteration ")
