"""The task's side of the warm task host: how a component hands its stage call to the host.

Under ``ac2 run`` on this machine, ``pipelines.taskhost`` runs a host process that has the
stage code imported and forks one worker per call; ``AC2_TASK_HOST`` names its socket in
the tasks' environment. A call is a function of this package's import path and its
keyword arguments (JSON); the worker takes over the task's stdout, stderr, environment
and working directory, runs it, and replies its JSON value:

    task process                        host (imports done once)
    ------------                        ------------------------
    connect to the socket       ---->   accept; receive the call and the task's
    send call + stdout/stderr fds       stdout and stderr file descriptors
                                        load the models the call names, unless
                                          loaded for an earlier task (same content)
                                        fork a worker: become the task's process,
                                          run the function, reply its value, exit
    annotate the outputs,       <----
    as without a host

Where no host answers (a cluster, ``--cold-tasks``, a host that has gone or whose source
files changed) the task runs the function itself, and says so when it expected a host.
Imported by component bodies in the task's process: standard library only.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import socket
import struct
import sys
from collections.abc import Callable

ENV = "AC2_TASK_HOST"  # the host's socket path, set for kfp.local's task processes
STARTED = b"+"  # a worker's first byte: from here on, the function may have run
REFUSED = b"-"  # the host's first byte when it runs nothing, then why
HEADER = struct.Struct("!I")  # a reply's length
MAX_CALL = 1 << 20


class HostUnavailable(ConnectionError):
    """No host answers at the socket ``AC2_TASK_HOST`` names, or it refused the call."""


def reference(fn: Callable) -> str:
    """``module:name`` of a module-level function: how a call names it to the host."""
    return f"{fn.__module__}:{fn.__qualname__}"


def resolve(target: str) -> Callable:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def plain(value):
    """JSON for what ``json`` does not know: numpy and torch scalars by value, anything else as text."""
    return value.item() if hasattr(value, "item") else str(value)


def call_or_run(fn: Callable, kwargs: dict, *, label: str, preload: dict | None = None):
    """``fn(**kwargs)`` as JSON values, run by the host that ``AC2_TASK_HOST`` names, if one answers,
    else in this process. ``label`` names the call in the message printed when the host fails.

    ``preload`` (``{"config_path": ..., "models": [[uri, kind], ...]}``): models the host loads
    before it forks the worker, which then calls ``fn(**kwargs, models=<the host's LoadedModels>)``;
    ``fn`` must take ``models`` (None where no host runs it)."""
    if address := os.environ.get(ENV):
        try:
            return call(fn, kwargs, address=address, preload=preload)
        except HostUnavailable as e:
            print(f"ac2: {e}; running {label} in the task's own process", file=sys.stderr, flush=True)
    return json.loads(json.dumps(fn(**kwargs), default=plain))


def call(fn: Callable, kwargs: dict, *, address: str, preload: dict | None = None):
    """Have the host at ``address`` run ``fn(**kwargs)`` in a worker that writes to this
    process's stdout and stderr; returns its value (JSON). Raises what ``fn`` raised."""
    target = reference(fn)
    body = {"target": target, "kwargs": kwargs, "env": dict(os.environ), "cwd": os.getcwd()}
    request = json.dumps(body | ({"preload": preload} if preload else {})).encode()
    sys.stdout.flush()
    sys.stderr.flush()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(address)
        except OSError as e:
            raise HostUnavailable(f"no task host at {address}: {e}") from None
        sent = socket.send_fds(conn, [request], [sys.stdout.fileno(), sys.stderr.fileno()])
        conn.sendall(request[sent:])  # the environment travels too: a large one may not go in one message
        conn.shutdown(socket.SHUT_WR)
        started, reply = _read_reply(conn)
    if not started:  # the host closed the call without forking: nothing ran
        raise HostUnavailable(f"the task host at {address} refused the call: {reply or 'no reason given'}")
    if reply is None:
        raise RuntimeError(f"the task host's worker for {target} died before it replied (killed? out of memory?)")
    if "error" in reply:
        raise _rebuilt(reply["error"])
    return reply["value"]


def _read_reply(conn: socket.socket) -> tuple[bool, dict | str | None]:
    """(whether a worker started, its reply if it finished one or the host's refusal)."""
    data = b""
    with contextlib.suppress(ConnectionResetError):  # a host that exits resets the calls it queued
        while chunk := conn.recv(65536):
            data += chunk
    if not data.startswith(STARTED):
        return False, data[len(REFUSED) :].decode(errors="replace") if data.startswith(REFUSED) else None
    data = data[len(STARTED) :]
    if len(data) < HEADER.size:
        return True, None
    (size,) = HEADER.unpack_from(data)
    body = data[HEADER.size : HEADER.size + size]
    return True, (json.loads(body) if len(body) == size else None)


def _rebuilt(error: dict) -> BaseException:
    """The worker's exception as the same class where that class takes a message, so a
    failure reads as it would without a host (the worker printed the traceback)."""
    cls = None
    with contextlib.suppress(Exception):
        cls = getattr(importlib.import_module(error["module"]), error["type"])
    if isinstance(cls, type) and issubclass(cls, Exception):
        with contextlib.suppress(Exception):
            exc = cls(error["message"])
            if str(exc) == error["message"]:
                exc.add_note("(raised in the task host's worker; its traceback is printed above)")
                return exc
    return RuntimeError(f"{error['type']}: {error['message']}")
