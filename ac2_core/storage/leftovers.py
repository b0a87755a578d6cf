"""What a publish that died leaves behind, named so that it can be found and removed.

A writer stages an artifact in a folder of its own before it appears (``artifacts``):
beside the target on a local disk, in this machine's temp folder for an object store.
A replaced or removed local artifact is first renamed aside; a stage that launches
processes gives them a scratch folder in the temp folder. A process that is killed
(SIGKILL, out of memory, a lost node) leaves these folders; on an object store it may
also leave some objects of an artifact whose manifest was never uploaded. None of them
is an artifact a reader would take (no manifest, or a name beginning with a dot), but
each can be as large as a checkpoint, so the next run removes them (``remove_leftovers``,
under the run folder's lock) and says what it removed.

Every such folder is named ``.<artifact>.<what>-<host>-<pid>-<random>``, so that a sweep
leaves alone those of a process of this machine that is still running; so is the staging
file of a run folder's plain file (``files.write_text``: the recorded config, the timings).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
import uuid
from pathlib import Path

from ac2_core.storage.manifest import MANIFEST
from ac2_core.storage.remote import call
from ac2_core.storage.uris import Target, target

STAGING, REPLACED, DOWNLOAD, LAUNCH = "staging", "old", "download", "launch"  # LAUNCH: ac2_core.launch's scratch
_NAME = re.compile(r"^\.(?:.*?\.)?(staging|old|download|launch)-(?:(?P<host>.+)-(?P<pid>\d+)-)?[0-9a-z_]+$")
HOST = socket.gethostname()


def aside_name(name: str, what: str) -> str:
    """``.<name>.<what>-<host>-<pid>-<random>``: a folder of this process that no reader takes for an artifact."""
    return f"{staging_prefix(name, what)}{uuid.uuid4().hex[:8]}"


def staging_prefix(name: str, what: str = STAGING) -> str:
    """The prefix of a ``tempfile.mkdtemp`` folder named as ``aside_name`` (mkdtemp appends the random part);
    without ``name``, ``.<what>-<host>-<pid>-``."""
    return f".{name + '.' if name else ''}{what}-{HOST}-{os.getpid()}-"


def alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _abandoned(name: str, *, elsewhere: bool) -> bool:
    """True for a leftover folder's name whose process is gone. With ``elsewhere`` (a locked run
    folder), also one of another machine or of an older ac2 that did not name its process."""
    m = _NAME.match(name)
    if m is None:
        return False
    if m["pid"] is None or m["host"] != HOST:
        return elsewhere
    return int(m["pid"]) != os.getpid() and not alive(int(m["pid"]))


def remove_leftovers(root: str, *, plain: tuple[str, ...] = ()) -> list[str]:
    """Remove what unfinished publishes left under the run folder ``root``; returns what was removed.

    The caller holds the run folder's lock, so no other run writes there: leftovers of
    other machines go too, those of a live process of this machine stay. On an object
    store, a folder that holds objects but no manifest (a publish or a removal that did
    not finish) is removed whole, except the run folder's folders of plain files that
    ``plain`` names (TensorBoard's event files). This machine's temp folder is swept as
    well (``remove_temp_leftovers``).
    """
    t = target(root)
    found = _local_leftovers(Path(t.path)) if t.local else _remote_leftovers(t, plain)
    for path in found:
        if t.local and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif t.local:  # a plain file's staging (``files.write_text``)
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        else:
            call(t, f"removal of {path}", "rm", path, recursive=True)
    removed = [p if t.local else t.fs.unstrip_protocol(p) for p in found]
    return removed + remove_temp_leftovers()


def _local_leftovers(root: Path) -> list[str]:
    found = []
    for folder, dirs, files in os.walk(root):
        for d in list(dirs):
            if _abandoned(d, elsewhere=True):
                found.append(os.path.join(folder, d))
                dirs.remove(d)
        found += [os.path.join(folder, f) for f in files if _abandoned(f, elsewhere=True)]
    return sorted(found)


def _remote_leftovers(t: Target, plain: tuple[str, ...] = ()) -> list[str]:
    """Folders under ``t`` that hold objects and no manifest, and no artifact above them (nor
    under the folders of plain files that ``plain`` names)."""
    root = t.path.rstrip("/")
    keys = [k for k in _keys(t, root) if not any(k.startswith(f"{root}/{p}/") for p in plain)]
    published = {k.rsplit("/", 1)[0] for k in keys if k.rsplit("/", 1)[-1] == MANIFEST}
    orphans = set()
    for key in keys:
        folder = key.rsplit("/", 1)[0]
        if folder == root or not folder.startswith(root + "/"):
            continue  # files of the run folder itself (its lock), not of an artifact
        ancestors = [folder]
        while ancestors[-1].rsplit("/", 1)[0].startswith(root + "/"):
            ancestors.append(ancestors[-1].rsplit("/", 1)[0])
        if not published.intersection(ancestors):
            orphans.add(folder)
    # a nested folder goes with its parent
    return sorted(f for f in orphans if not any(f.startswith(o + "/") for o in orphans))


def _keys(t: Target, root: str) -> list[str]:
    return [k for k, info in call(t, "listing", "find", root, detail=True).items() if info.get("type") == "file"]


def remove_temp_leftovers(temp: str | None = None) -> list[str]:
    """Staging folders of remote publishes, unfinished model downloads and launches' scratch folders in this machine's temp
    folder (``temp``, default ``tempfile.gettempdir()``) whose process is gone; returns what was removed."""
    base = Path(temp or tempfile.gettempdir())
    removed = []
    for parent in (base, base / "ac2-models"):
        with contextlib.suppress(OSError):
            for entry in parent.iterdir():
                if entry.is_dir() and _abandoned(entry.name, elsewhere=False):
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(str(entry))
    return sorted(removed)
