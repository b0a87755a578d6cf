"""The warm task host for kfp.local: a process that imports ac2's stage code once and
forks one worker per task, so a task does not pay the interpreter's imports again.

Each kfp.local task is a fresh ``python -m kfp.dsl.executor_main``. Five of the stages
load a model, and importing transformers' model code alone costs about 5 s of CPU on the
2-core dev machine: more than the toy stages themselves. With a host running, a
component body hands its stage call here (the task's side, and the protocol, are
``components.taskhost``); a worker forked for the call becomes the task's process in all
that a stage sees (its stdout and stderr, environment and working directory), runs it,
replies and exits.

The worker is a new process per task, as a task is; what it shares with its siblings is
imported code and loaded models, nothing else (the host runs no stage code, and it refuses
to fork while another Python thread runs). So the host imports, besides the stage code, what
the stages import lazily (``preload_modules``): pandas, which pyarrow imports to build a table,
cost every task 0.15 s of CPU, and deepspeed, which accelerate imports to save a model, 0.8 s.
Each worker's line in the host's log gives its wall and CPU seconds and what it still imported
for itself. A call names the model artifacts its stage
reads; the host loads each on the CPU before it forks the worker, unless a checkpoint of
the same content hash is loaded already (``ac2_core.models.store.LoadedModels``: artifacts
are immutable), so an iteration's actor and critic are each built once, not once per task.
The host itself never computes with them: it runs torch on one thread, so no OpenMP
thread team exists when it forks (a worker forked after the host had run an OpenMP region
hung in its first one). Artifacts are byte-identical with and without the host
(``tests/pipeline``). On a cluster there is no host and every task imports for itself:
there, stages run for minutes and the imports are noise.

The host binds its socket before it imports, so tasks that arrive early wait in the
accept queue. It runs in its own session and is stopped with its workers by process group
(``running``). It also dies with the process that started it, however that one dies
(SIGKILL included): it watches the read end of a pipe whose only write end that process
holds, and on end-of-file it stops its workers and removes its socket folder. A task whose
host is gone runs the stage itself and says so; so does a task whose host imported ac2
source files that have changed since (a cold task would run the new code).
"""

from __future__ import annotations

import argparse
import atexit
import collections
import contextlib
import importlib
import json
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

from components.taskhost import ENV, HEADER, MAX_CALL, REFUSED, STARTED, plain, resolve

READY = "ready"  # a file next to the socket once the imports are done
MODEL_BYTES = 2 << 30  # weights the host keeps loaded, newest first: the toy's and tiny's two iterations many times over


def preload_modules() -> list[str]:
    """What the host imports before it serves: every stage and what stages import lazily. A module
    that a worker imports for itself costs its CPU again in every task that needs it (the
    ``taskhost: worker`` lines of the host's log count them)."""
    from ac2_core.stages.recipe import STAGES

    return [
        "components.io",
        "ac2_core.runner.layout",  # components.io's execute_stage
        *(f"ac2_core.stages.{stage}" for stage in STAGES),
        "ac2_core.stages.critic_io",
        "ac2_core.generation.scoring",
        "ac2_core.math",
        "ac2_core.models.hf",
        "ac2_core.training.torch_backend",
        "ac2_core.training.sft",
        "transformers.models.qwen3.modeling_qwen3",  # the built-in model's code (AutoModel resolves it lazily)
        "pyarrow.pandas_compat",  # Table.from_pylist imports it, and pandas: 0.15 s of CPU in every stage that writes a table
        "ac2_core.runner.report",
        "s3fs",  # optional extra
        *_deepspeed(),
    ]


def _deepspeed() -> list[str]:
    """deepspeed, where forking survives its import. accelerate's unwrap_model, in every
    ``save_pretrained`` (update_actor, update_critic), imports it where it is installed: 0.8 s of
    CPU a task. Importing it picks its accelerator, which with a CUDA device visible initializes
    CUDA's driver, and a worker forked after that cannot use CUDA; ``torch.cuda.device_count``
    asks NVML, which does not. So with a CUDA device each worker imports it for itself."""
    import torch

    return [] if torch.cuda.device_count() else ["deepspeed"]  # optional extra


# --------------------------------------------------------------------- host side


def serve(address: str, parent_fd: int | None = None) -> None:
    """Bind ``address``, import the stage code, then fork a worker per connection until the
    host is stopped or ``parent_fd`` (a pipe's read end) reaches end-of-file: its parent is gone."""
    try:
        _serve(address, parent_fd)
    finally:
        for leftover in (address, address + ".new", str(Path(address).with_name(READY))):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
        with contextlib.suppress(OSError):  # the folder ``running`` made, once empty
            os.rmdir(Path(address).parent)


def _parent_gone(parent_fd: int | None) -> bool:
    """True once the parent's end of the pipe is closed (it exited or was killed); does not wait."""
    return parent_fd is not None and bool(select.select([parent_fd], [], [], 0)[0])


def _orphaned() -> None:
    """Stop this host's workers (its process group) and exit: nothing will call it again."""
    print(f"taskhost: the process that started it is gone; stopping (pid {os.getpid()})", flush=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(os.getpgrp(), signal.SIGTERM)
    raise SystemExit(0)


def _serve(address: str, parent_fd: int | None) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address + ".new")
    os.chmod(address + ".new", 0o600)
    listener.listen(64)
    os.rename(address + ".new", address)  # so that a socket file at ``address`` always listens
    t0 = time.perf_counter()
    for name in preload_modules():
        if _parent_gone(parent_fd):
            _orphaned()
        try:
            importlib.import_module(name)
        except ImportError as e:  # optional extras; a worker that needs one reports it
            print(f"taskhost: not preloaded: {name} ({e})", flush=True)
    print(f"taskhost: imports done in {time.perf_counter() - t0:.1f}s ({time.process_time():.1f}s CPU); {_threads()}", flush=True)
    if threading.active_count() != 1:  # a lock another Python thread holds at fork stays held in the worker
        raise SystemExit(f"taskhost: {threading.active_count()} Python threads after the imports; forking is unsafe")
    imported = _source_files()
    models, worker_threads = _loaded_models()
    Path(address).with_name(READY).touch()
    signal.signal(signal.SIGCHLD, _reap)  # reaped here, so their CPU time counts as this process's children's
    signal.signal(signal.SIGTERM, _stop)
    while True:
        if parent_fd is not None and parent_fd in select.select([listener, parent_fd], [], [])[0]:
            _orphaned()
        conn, _ = listener.accept()
        try:
            request, fds = _receive(conn)
        except Exception as e:  # a malformed call: refuse it, keep serving
            _refuse(conn, f"a malformed call ({e})")
            continue
        try:
            if changed := _changed(imported):
                # a cold task would run the new code: so the task runs its stage itself
                _refuse(conn, f"{changed} changed since the host imported it")
                continue
            if "preload" in request:
                _preload(models, request["preload"])
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                listener.close()
                _work(conn, request, fds, models, worker_threads)  # never returns
            conn.close()
        finally:  # the worker has its own copies of the task's stdout and stderr
            for fd in fds:
                os.close(fd)


def _loaded_models():
    """The host's store of loaded checkpoints, and torch's thread count for the workers: the host
    itself runs torch on one thread from here on (see the module's docstring)."""
    import torch

    from ac2_core.models.store import LoadedModels

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    return LoadedModels(MODEL_BYTES), threads


def _preload(models, preload: dict) -> None:
    """Load the models a call names (``components.taskhost.call_or_run``). A model that fails to
    load is left to the worker, which loads it itself and reports the error as the task's."""
    from ac2_core import storage
    from ac2_core.config import config_from_json

    try:
        cfg = config_from_json(Path(preload["config_path"]).read_text())
        with storage.using(cfg.storage):
            for uri, kind in preload["models"]:
                t0 = time.perf_counter()
                if models.preload(cfg, uri, kind):
                    print(f"taskhost: loaded {kind} {uri} in {time.perf_counter() - t0:.2f}s", flush=True)
    except Exception as e:  # noqa: BLE001 - the worker meets the same error, in the task's own output
        print(f"taskhost: not preloaded ({type(e).__name__}: {e})", flush=True)


def _refuse(conn: socket.socket, why: str) -> None:
    print(f"taskhost: refused a call: {why}", flush=True)
    with contextlib.suppress(OSError):
        conn.sendall(REFUSED + why.encode())
    conn.close()


def _source_files() -> dict[str, int]:
    """The modification time of each source file of ac2's own packages that is imported."""
    files = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name.split(".")[0] in ("ac2_core", "components", "pipelines") and path:
            files[path] = os.stat(path).st_mtime_ns
    return files


def _changed(files: dict[str, int]) -> str | None:
    for path, mtime in files.items():
        try:
            if os.stat(path).st_mtime_ns != mtime:
                return path
        except FileNotFoundError:
            return path
    return None


def _reap(*_) -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _stop(*_) -> None:
    _reap()
    raise SystemExit(0)


def _threads() -> str:
    """The native threads besides this one: after the imports, OpenBLAS's pool (numpy) and
    jemalloc's background thread (pyarrow). Both libraries register fork handlers; no Python
    thread may run (``serve`` refuses to fork then)."""
    names = [Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task")]
    return f"threads: {', '.join(sorted(names))}"


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    msg, fds, _, _ = socket.recv_fds(conn, MAX_CALL, 2)
    data = msg
    while chunk := conn.recv(65536):
        data += chunk
        if len(data) > MAX_CALL:
            raise ValueError(f"a call of over {MAX_CALL} bytes")
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"a call with {len(fds)} file descriptors, not stdout and stderr")
    return json.loads(data), fds


def _work(conn: socket.socket, request: dict, fds: list[int], models, threads: int) -> None:
    """A worker: become the task's process (its output, environment and directory), run, reply, exit.
    A call that named models to preload gets the host's loaded models as ``models``. Torch runs
    ``threads`` threads, as in the host before it went down to one, until a stage's store sets its own.
    Once it has replied, it writes its figures to the host's log (``_worker_line``)."""
    status = 0
    started, known = time.perf_counter(), set(sys.modules)
    log = os.dup(1)  # the host's log, until the task's stdout takes fd 1
    try:
        conn.sendall(STARTED)
        import torch

        torch.set_num_threads(threads)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the stage may wait for its own subprocesses
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in fds:
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        extra = {"models": models} if "preload" in request else {}
        reply = {"value": resolve(request["target"])(**request["kwargs"], **extra)}
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the task
        traceback.print_exc()
        reply = {"error": {"type": type(e).__name__, "module": type(e).__module__, "message": str(e)}}
        status = 1
    try:
        body = json.dumps(reply, default=plain).encode()
        conn.sendall(HEADER.pack(len(body)) + body)
        conn.close()
        atexit._run_exitfuncs()  # what a task process runs at its exit (engines, process groups)
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(log, _worker_line(request, time.perf_counter() - started, set(sys.modules) - known).encode())
    finally:
        os._exit(status)


def _worker_line(request: dict, seconds: float, imported: set[str]) -> str:
    """The host log's line for a worker that has replied: its wall and CPU seconds (its own and its
    launched processes') and the modules it imported that the host had not, by package."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime  # a forked process starts at 0
    label = request["target"] + (f" ({request['kwargs']['stage']})" if "stage" in request["kwargs"] else "")
    packages = collections.Counter(name.split(".")[0] for name in imported)
    named = ", ".join(f"{p} ({n})" for p, n in sorted(packages.items(), key=lambda item: (-item[1], item[0])))
    return (
        f"taskhost: worker {os.getpid()} ran {label} in {seconds:.2f}s, {cpu:.2f}s CPU;"
        f" imported {len(imported)} module{'' if len(imported) == 1 else 's'} the host had not{': ' + named if named else ''}\n"
    )


# --------------------------------------------------------------------- lifetime


@contextlib.contextmanager
def running(log_file: Path) -> Iterator[str]:
    """Start a host (its output to ``log_file``) for the tasks this process starts;
    ``AC2_TASK_HOST`` names it while the block runs. Stops it and its workers after."""
    folder = tempfile.mkdtemp(prefix="ac2-host-")  # short: a socket path has a 107-byte limit
    address = os.path.join(folder, "socket")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    # the host watches the read end; only this process holds the write end (not inheritable),
    # so the host sees end-of-file when this process ends, however it ends
    watch, alive = os.pipe()
    with open(log_file, "ab") as log:
        host = subprocess.Popen(
            [sys.executable, "-m", "pipelines.taskhost", address, "--parent-fd", str(watch)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            pass_fds=(watch,),
            start_new_session=True,  # its own process group: Ctrl-C reaches us, and we stop it
        )
    os.close(watch)
    saved = os.environ.get(ENV)
    try:
        # the host listens before it imports, so this waits for the interpreter's start only
        _wait_for(Path(address), f"the task host to listen at {address} (log: {log_file})", 60, host)
        os.environ[ENV] = address
        yield address
    finally:
        if saved is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = saved
        with contextlib.suppress(ProcessLookupError):
            os.killpg(host.pid, signal.SIGTERM)
        try:
            host.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(host.pid, signal.SIGKILL)
            host.wait()
        os.close(alive)
        shutil.rmtree(folder, ignore_errors=True)


def wait_ready(address: str, timeout: float = 300) -> float:
    """Block until the host at ``address`` has done its imports (tasks need not: they queue);
    returns the seconds waited."""
    return _wait_for(Path(address).with_name(READY), f"the task host at {address} to finish its imports", timeout)


def _wait_for(path: Path, what: str, timeout: float, host: subprocess.Popen | None = None) -> float:
    """Seconds until ``path`` exists; an error if ``timeout`` passes or ``host`` exits first."""
    start = time.monotonic()
    while not path.exists():
        if host is not None and host.poll() is not None:
            raise RuntimeError(f"waiting for {what}: the task host exited with status {host.returncode}")
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"waited {timeout:g} s for {what}")
        time.sleep(0.02)
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m pipelines.taskhost", description=__doc__.split("\n\n")[0])
    p.add_argument("address", help="the Unix socket to serve on")
    p.add_argument("--parent-fd", type=int, help="a pipe's read end: stop when it reaches end-of-file (the parent is gone)")
    args = p.parse_args(argv)
    serve(args.address, args.parent_fd)


if __name__ == "__main__":
    main()
