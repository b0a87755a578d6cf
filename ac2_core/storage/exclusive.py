"""One small file created only if it is absent: how a run folder on an object store is locked.

A local run folder is locked with ``flock`` (``ac2_core.runner.lock``); an object store
has no locks, but S3 refuses a conditional write (``If-None-Match: *``) of a key that
exists, so that exactly one of two writers creates it.
"""

from __future__ import annotations

import contextlib

from ac2_core.storage.manifest import ArtifactError
from ac2_core.storage.remote import call
from ac2_core.storage.uris import target


def _exists_error(err: BaseException | None) -> bool:
    """True where ``err`` (or what caused it) is the store's refusal of a key that exists."""
    while err is not None:
        if isinstance(err, FileExistsError):
            return True
        response = getattr(err, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "PreconditionFailed" or status == 412:
                return True
        err = err.__cause__
    return False


def create_new(uri: str, data: bytes) -> bool:
    """Write ``data`` at ``uri`` unless something is there already; True if this call created it."""
    t = target(uri, write=True)
    try:
        call(t, f"creation of {uri}", "pipe_file", t.path, data, mode="create")
    except ArtifactError as e:
        if _exists_error(e.__cause__):
            return False
        raise
    return True


def read_bytes(uri: str) -> bytes | None:
    """The file at ``uri``, or None if there is none."""
    t = target(uri)
    try:
        return call(t, f"download of {uri}", "cat_file", t.path, missing_ok=True)
    except FileNotFoundError:
        return None


def delete(uri: str) -> None:
    t = target(uri, write=True)
    with contextlib.suppress(FileNotFoundError):
        call(t, f"removal of {uri}", "rm_file", t.path, missing_ok=True)
