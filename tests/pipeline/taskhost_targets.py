"""Stage-shaped functions (``fn(cfg, **kwargs) -> dict``) for the task host's tests."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from ac2_core.storage import ArtifactError


def echo(cfg, *, value, pid_file=None):
    """What the worker is: its pid, parent, environment and directory; prints to both streams."""
    print(f"stdout of {cfg.run_id}", flush=True)
    print(f"stderr of {cfg.run_id}", file=sys.stderr, flush=True)
    return {
        "value": value,
        "run_id": cfg.run_id,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "probe": os.environ.get("AC2_TEST_PROBE"),
        "cwd": os.getcwd(),
        "numpy_float": np.float32(0.5),  # not JSON: recorded as its value
    }


def fail_artifact(cfg, *, message):
    raise ArtifactError(message)


def fail_keyerror(cfg):
    raise KeyError("missing")  # str() adds quotes: not rebuilt as a KeyError


def die(cfg):
    os.kill(os.getpid(), signal.SIGKILL)


def wait(cfg, *, pid_file):
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(120)
    return {}
