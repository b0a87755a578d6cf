"""Start a stage's work in N processes on this machine, and read back what they wrote.

Two ways, one file protocol:

- ``torchrun``: ``python -m torch.distributed.run --standalone --nproc-per-node N -m MODULE
  SPEC``. The processes find each other through torchrun's rendezvous (``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK``) and form one torch.distributed group. Training uses it.
- ``spawn``: N plain processes ``python -m MODULE SPEC RANK N``, each given its own GPUs
  through ``CUDA_VISIBLE_DEVICES``. They never talk to each other. Sharded generation and
  critic scoring use it: a vLLM engine in a process that torchrun started would take
  torchrun's variables for its own group.

Each process gets its share of the launching process's CPU threads
(``threads.per_process``, which the caller passes as ``threads_each``): the spec's config
carries it as ``model.threads`` (``child_config``), and the environment as
``OMP_NUM_THREADS``, which torchrun then leaves alone.

The launch works in a scratch folder: ``spec.json`` (what to do, as JSON), and what each
process writes there (``result-<rank>.json``; ``error-<rank>.txt`` when it failed). The
children print to the stage's own output. Any child that fails fails the launch: the
others are stopped, and the error names the first failed rank and its message.
Nothing crosses a process boundary as pickle.

The launched processes die with the stage's process, however it dies: each one (and
torchrun's agent, started through this module) asks the kernel for SIGKILL when its
parent ends. torchrun starts its workers in sessions of their own, so a kill of the
stage's process group would not reach them, and a rank 0 left running would publish a
checkpoint into a run folder that the next run has taken over. The scratch folder is
named as the storage's leftovers are (``storage.leftovers``), so the next run removes one
that a killed stage left in the temp folder. A child ends with ``exit_now``.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import ac2_core
from ac2_core.config import AC2Config
from ac2_core.storage import ArtifactError
from ac2_core.storage.leftovers import LAUNCH, alive, staging_prefix

SPEC = "spec.json"
MODULE = "ac2_core.launch"  # torchrun's agent runs here (``_agent``), to die with its parent
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class LaunchError(RuntimeError):
    """A launched process failed; the message names its rank and what it raised."""


# errors that reach the stage's caller as what they were: a bad input or artifact, said in one line
KEPT = (ValueError, ArtifactError)


@contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A fresh folder for one launch in the temp folder, removed afterwards (a killed stage's, by the next run)."""
    with tempfile.TemporaryDirectory(prefix=staging_prefix(prefix, LAUNCH)) as folder:
        yield Path(folder)


def child_config(cfg: AC2Config, threads_each: int) -> str:
    """``cfg`` as JSON for launched processes of ``threads_each`` threads each (``model.threads``,
    which is not hashed: their artifacts carry the same config hash)."""
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"threads": threads_each})}).to_json()


def write_spec(folder: Path, spec: dict) -> Path:
    """``spec`` as the children read it, with this process's pid: they end when it is gone."""
    path = folder / SPEC
    path.write_text(json.dumps(spec | {"launcher": os.getpid()}))
    return path


def torchrun(module: str, folder: Path, processes: int, *, threads_each: int, what: str) -> None:
    """Run ``python -m module folder/spec.json`` in ``processes`` processes under torchrun, with
    ``OMP_NUM_THREADS=threads_each`` (torchrun would set 1 for several processes itself)."""
    command = [
        sys.executable,
        "-m",
        MODULE,  # torch.distributed.run's main, in an agent that dies with this process
        str(os.getpid()),
        "--standalone",
        f"--nproc-per-node={processes}",
        "-m",
        module,
        str(folder / SPEC),
    ]
    code = subprocess.run(command, env=_child_env({"OMP_NUM_THREADS": str(threads_each)}), check=False).returncode
    if code != 0:
        raise _failure(folder, what, f"torchrun exited with {code}")


def spawn(module: str, folder: Path, devices: list[list[str]] | None, processes: int, *, threads_each: int, what: str) -> None:
    """Run ``python -m module folder/spec.json RANK processes`` once per rank, side by side.

    ``devices``: the GPUs (CUDA_VISIBLE_DEVICES entries) of each rank; None on CPU.
    ``threads_each``: each one's ``OMP_NUM_THREADS``.
    """
    children = []
    for rank in range(processes):
        extra = {"OMP_NUM_THREADS": str(threads_each)} | ({"CUDA_VISIBLE_DEVICES": ",".join(devices[rank])} if devices else {})
        command = [sys.executable, "-m", module, str(folder / SPEC), str(rank), str(processes)]
        children.append(subprocess.Popen(command, env=_child_env(extra)))
    codes = _wait_all(children)
    failed = [rank for rank, code in enumerate(codes) if code != 0]
    if failed:
        raise _failure(folder, what, f"rank {failed[0]} exited with {codes[failed[0]]}")


def _wait_all(children: list[subprocess.Popen]) -> list[int]:
    """Exit codes of all children; once one fails, the others are stopped (they would wait or work in vain)."""
    codes: list[int | None] = [None] * len(children)
    while any(c is None for c in codes):
        for i, child in enumerate(children):
            if codes[i] is None:
                try:
                    codes[i] = child.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    continue
                if codes[i] != 0:
                    for other in children:
                        if other.poll() is None:
                            other.terminate()
    return [int(c) for c in codes]


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    """This environment, with this code's source root first on PYTHONPATH (so the children import
    the ac2_core this process runs, from any working directory) and ``extra`` on top."""
    env = dict(os.environ)
    root = str(Path(ac2_core.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root)])
    return env | extra


def _failure(folder: Path, what: str, fallback: str) -> Exception:
    """The first recorded error, as a LaunchError unless it is one of KEPT.

    First in time: when one process fails, the others fail after it, on the closed connection.
    """
    errors = sorted(folder.glob("error-*.txt"), key=lambda p: (p.stat().st_mtime_ns, p.name))
    if not errors:
        return LaunchError(f"{what}: {fallback}; the processes' output is above")
    kind, _, message = errors[0].read_text().partition("\n")
    rank = errors[0].stem.split("-")[1]
    text = f"{what}, rank {rank}: {message.strip()}"
    kept = {k.__name__: k for k in KEPT}
    return kept[kind](text) if kind in kept else LaunchError(f"{text} ({kind})")


# ---------------------------------------------------------------- the children's side


def read_spec(path: str) -> tuple[Path, dict]:
    """The launch's folder and its spec, in a child, which from now on dies with its parent."""
    spec_path = Path(path)
    spec = json.loads(spec_path.read_text())
    die_with_parent(spec["launcher"])
    return spec_path.parent, spec


def die_with_parent(launcher: int) -> None:
    """SIGKILL this process when its parent ends (Linux), and end it now if ``launcher``, the stage's
    process that started the launch (this process's parent, or torchrun's agent's), is already gone.

    The kernel sends the signal when the thread that started this process ends: the launcher
    starts its children from the thread that waits for them.
    """
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if not alive(launcher):  # it died before the signal was asked for
        os._exit(1)


def write_result(folder: Path, rank: int, result) -> None:
    """What rank ``rank`` hands back (JSON), written whole: to a temporary name, then renamed."""
    tmp = folder / f".result-{rank}.json"
    tmp.write_text(json.dumps(result))
    tmp.replace(folder / f"result-{rank}.json")


def read_result(folder: Path, rank: int):
    return json.loads((folder / f"result-{rank}.json").read_text())


def exit_now(code: int) -> None:
    """End this process with ``code`` once its exit handlers have run and its output is flushed:
    ``os._exit``, so that no native thread torn down with the interpreter (torch's and Arrow's
    pools: ``terminate called without an active exception``, rc 134) can change the code."""
    try:
        atexit._run_exitfuncs()  # what a normal exit runs: logging's flush, engines' and process groups' shutdown
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe (ac2 ... | head)
                pass
        os._exit(code)


def run_child(folder: Path, rank: int, work: Callable[[], None]) -> int:
    """Run ``work`` in a child; on an exception, record it for the parent and return 1."""
    try:
        work()
    except Exception as e:
        kind = next((k.__name__ for k in KEPT if isinstance(e, k)), type(e).__name__)
        (folder / f"error-{rank}.txt").write_text(f"{kind}\n{e}\n")
        traceback.print_exc()
        return 1
    return 0


def _agent(argv: list[str]) -> None:
    """torchrun's agent (``python -m torch.distributed.run ARGS``) as ``python -m ac2_core.launch PID ARGS``:
    it dies with ``PID``, the stage's process that started it."""
    launcher, args = int(argv[0]), argv[1:]
    die_with_parent(launcher)
    from torch.distributed.run import main

    main(args)


if __name__ == "__main__":
    _agent(sys.argv[1:])
