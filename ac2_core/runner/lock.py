"""The run folder's lock: one run writes to a run folder at a time.

``held(out_dir)`` is taken by the iteration loop once the config and data are checked,
and released when the run ends. A second ``ac2 run`` on the same folder stops with
``RunFolderLocked``, naming the holder (pid, host, start time, command).

- A local folder is locked with ``flock`` on ``<out>/run.lock``. The kernel releases the
  lock when its process dies, however it dies, so a lock file whose lock is free is the
  one a killed run left: the next run takes it over and warns, naming that run.
- On an object store, ``<out>/run.lock`` is created only if absent (a conditional write).
  A lock left by a process of this machine that is gone is taken over with a warning; one
  of another machine cannot be checked, so the error says to delete it if that run is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from ac2_core import storage
from ac2_core.storage import exclusive
from ac2_core.storage.leftovers import alive
from ac2_core.storage.uris import target

LOCK = "run.lock"
Log = Callable[[str], None]


class RunFolderLocked(RuntimeError):
    """Another run writes to this run folder; the message names it."""


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    started: str  # local time, ISO 8601
    command: str
    token: str  # tells this holder from an earlier one with the same pid

    @classmethod
    def me(cls) -> Holder:
        command = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))
        return cls(os.getpid(), socket.gethostname(), time.strftime("%Y-%m-%dT%H:%M:%S%z"), command, uuid.uuid4().hex)

    @classmethod
    def parse(cls, data: bytes) -> Holder | None:
        try:
            return cls(**json.loads(data))
        except (ValueError, TypeError):  # empty (a writer killed before it wrote), or not ours
            return None

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), sort_keys=True) + "\n").encode()

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host}, started {self.started} ({self.command})"


@contextlib.contextmanager
def held(out_dir: str, *, log: Log = print) -> Iterator[Holder]:
    """Hold ``out_dir``'s lock for the block (the folder is made if need be); RunFolderLocked if another run holds it."""
    me = Holder.me()
    t = target(storage.join(out_dir, LOCK), write=True)  # refused outside storage.artifact_root, before anything exists
    with _flock(Path(t.path).parent, me, log) if t.local else _object_lock(storage.join(out_dir, LOCK), me, log):
        yield me


def _refused(where: str, holder: Holder | None, hint: str) -> RunFolderLocked:
    who = str(holder) if holder else "a run that has not yet written its name"
    return RunFolderLocked(f"{where}: another run is writing to this run folder: {who}; {hint}")


@contextlib.contextmanager
def _flock(folder: Path, me: Holder, log: Log) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Holder.parse(os.pread(fd, 4096, 0))
            os.close(fd)
            raise _refused(str(folder), holder, "wait for it to end, or stop it") from None
        try:  # a holder that ended between our open and our flock unlinked the file we locked: lock the new one
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        if previous := Holder.parse(os.pread(fd, 4096, 0)):
            log(f"warning: {folder} was locked by {previous}, which is no longer running; taking its lock over")
        os.ftruncate(fd, 0)
        os.pwrite(fd, me.to_bytes(), 0)
        yield
    finally:
        path.unlink(missing_ok=True)  # before the lock is let go: a file that is there is a held or a stale lock
        os.close(fd)


@contextlib.contextmanager
def _object_lock(uri: str, me: Holder, log: Log) -> Iterator[None]:
    for _ in range(3):
        if exclusive.create_new(uri, me.to_bytes()):
            break
        data = exclusive.read_bytes(uri)
        if data is None:  # released meanwhile
            continue
        holder = Holder.parse(data)
        if holder is None or holder.host != me.host or alive(holder.pid):
            raise _refused(uri.removesuffix("/" + LOCK), holder, f"wait for it to end; if that run is gone, delete {uri}")
        log(f"warning: {uri} was left by {holder}, which is no longer running; taking it over")
        exclusive.delete(uri)
    else:
        raise RunFolderLocked(f"{uri}: could not take the lock in 3 tries: other runs are starting on this run folder")
    try:
        yield
    finally:
        if Holder.parse(exclusive.read_bytes(uri) or b"") == me:
            exclusive.delete(uri)
