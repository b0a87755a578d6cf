"""Plain files of a run folder that are not artifacts: the recorded config, the summary,
wall-clock timings, tracker event files. Local paths or object storage, like artifacts.

They have no manifest: each is one file, written in one step (a rename beside it on a local
disk; a single upload, which object stores make visible whole).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ac2_core.storage.leftovers import staging_prefix
from ac2_core.storage.remote import call
from ac2_core.storage.uris import target


def write_text(uri: str, text: str) -> None:
    """Write ``text`` at ``uri`` whole: readers see the old file or the new one."""
    t = target(uri, write=True)
    if not t.local:
        call(t, "upload", "pipe_file", t.path, text.encode())
        return
    path = Path(t.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # named as leftovers are, so that the next run removes the staging a killed write left
    fd, tmp = tempfile.mkstemp(prefix=staging_prefix(path.name), dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def read_text(uri: str) -> str | None:
    """The file at ``uri``, or None where there is none."""
    t = target(uri)
    try:
        return call(t, "download", "cat_file", t.path, missing_ok=True).decode()
    except FileNotFoundError:
        return None


def put_file(local: Path, uri: str) -> None:
    """Copy the local file ``local`` to ``uri`` (an upload to object storage)."""
    t = target(uri, write=True)
    if t.local:
        dest = Path(t.path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.resolve() != local.resolve():
            dest.write_bytes(local.read_bytes())
        return
    call(t, f"upload of {local.name}", "put_file", str(local), t.path, nbytes=local.stat().st_size)
