"""Functions for the task host's tests to call: what a worker is, and ways to fail."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from ac2_core.storage import ArtifactError

MARK = "from the worker"


def echo(*, value, pid_file=None):
    """What the worker is: its pid, parent, environment and directory; prints to both streams."""
    print(f"stdout {MARK}", flush=True)
    print(f"stderr {MARK}", file=sys.stderr, flush=True)
    return {
        "value": value,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "probe": os.environ.get("AC2_TEST_PROBE"),
        "cwd": os.getcwd(),
        "numpy_float": np.float32(0.5),  # not JSON: recorded as its value
    }


def fail_artifact(*, message):
    raise ArtifactError(message)


def fail_keyerror():
    raise KeyError("missing")  # str() adds quotes: not rebuilt as a KeyError


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def wait(*, pid_file):
    # written whole, then renamed: the test polls for the file and must never read it half-written
    part = Path(f"{pid_file}.part")
    part.write_text(str(os.getpid()))
    part.rename(pid_file)
    time.sleep(120)
    return {}
